"""The typed errors of docs/errors.md in both clients: every SQLSTATE the page lists has a class in
the Python client (pgfence.errors) and in the Deno client (clients/deno/mod.ts's errorClasses),
under the same name; raised by the server, each comes back as its own class, redacted; and the
clients raise them. (The Deno client's own test raises each code through postgres.js:
clients/deno/client_test.ts.) Negative controls: a code added to the page without a class, a
class named otherwise in one client, and a code no map has, are each caught."""

from __future__ import annotations

import asyncio
import re
import uuid

import psycopg
import pytest

from pgfence import aio, client
from pgfence.connection import connect
from pgfence.errors import ERROR_CLASSES, PgfenceError, ResourceDisabled, ResourceUnknown, typed
from testkit.harness import Database
from tests.support import ROOT

ERRORS_MD = ROOT / "docs/errors.md"
MOD_TS = ROOT / "clients/deno/mod.ts"


def documented_codes(text: str) -> list[str]:
    """The SQLSTATEs docs/errors.md names: backquoted five-character codes with a digit (the
    Deno test's rule)."""
    codes = {c for c in re.findall(r"`([0-9A-Z]{5})`", text) if re.search(r"\d", c)}
    return sorted(codes)


def deno_classes(text: str) -> dict[str, str]:
    """mod.ts's errorClasses: SQLSTATE -> class name."""
    block = re.search(r"export const errorClasses[^{]*\{(.*?)\}\);", text, flags=re.S)
    assert block, "clients/deno/mod.ts has no errorClasses map"
    return dict(re.findall(r'"?([0-9A-Z]{5})"?: (\w+),', block.group(1)))


def disagreements(doc: str, deno: dict[str, str], python: dict[str, str]) -> list[str]:
    """What does not match between the page and the two clients' maps."""
    found = []
    for code in documented_codes(doc):
        if code not in deno or code not in python:
            found.append(f"{code}: deno {deno.get(code)}, python {python.get(code)}")
        elif deno[code] != python[code]:
            found.append(f"{code}: deno {deno[code]}, python {python[code]}")
    found += [f"{code}: not in docs/errors.md" for code in sorted(set(deno) | set(python))
              if code not in documented_codes(doc)]
    return found


def python_classes() -> dict[str, str]:
    return {code: cls.__name__ for code, cls in ERROR_CLASSES.items()}


def test_docs_and_both_clients_name_the_same_classes() -> None:
    doc, deno = ERRORS_MD.read_text(), deno_classes(MOD_TS.read_text())
    codes = documented_codes(doc)
    assert "PF001" in codes and "55P03" in codes and len(codes) >= 12, codes
    assert disagreements(doc, deno, python_classes()) == []
    assert len(set(python_classes().values())) == len(codes)      # one class per code
    # Negative controls: a new code on the page, a class renamed in one client.
    assert disagreements(doc + "\n| `PF042` | a new condition | | |\n", deno,
                         python_classes()) == ["PF042: deno None, python None"]
    assert disagreements(doc, {**deno, "PF003": "Disabled"}, python_classes()) == [
        "PF003: deno Disabled, python ResourceDisabled"]


def raised(db: Database, code: str) -> psycopg.Error:
    """The error the server raises with ``code``, a lease id in its message, as pgfence does."""
    with connect(db.dsn, "errors") as conn, pytest.raises(psycopg.Error) as e:
        conn.execute(f"do $$ begin raise exception 'pgfence: lease {uuid.uuid4()} test' "
                     f"using errcode = '{code}', hint = 'h', detail = 'ref {uuid.uuid4()}'; end $$")
    return e.value


def test_every_documented_sqlstate_comes_back_as_its_own_class(db: Database) -> None:
    for code in documented_codes(ERRORS_MD.read_text()):
        e = typed(raised(db, code))
        assert isinstance(e, ERROR_CLASSES[code]) and type(e) is not PgfenceError, code
        assert isinstance(e, psycopg.Error) and e.sqlstate == code, code  # still psycopg's
        assert (e.hint, e.detail) == ("h", "ref …"), code
        assert e.diag.message_primary == str(e) == "pgfence: lease … test", code
        assert e.retryable == (code in ("40001", "40P01", "55P03")), code
    # psycopg's own class of a standard code is kept: who caught it still does.
    assert isinstance(typed(raised(db, "40001")), psycopg.errors.SerializationFailure)
    # Negative control: a code no map has comes back as psycopg raised it.
    other = raised(db, "PF042")
    assert typed(other) is other and not isinstance(other, PgfenceError)


def test_the_clients_raise_them(db: Database) -> None:
    db.sql("select pgfence.register('off', false)")
    with pytest.raises(ResourceDisabled) as disabled:
        client.Owner(db.dsn, "off").acquire()
    assert disabled.value.sqlstate == "PF003" and disabled.value.hint
    with pytest.raises(ResourceUnknown):
        asyncio.run(aio.Owner(db.dsn, "nowhere").acquire())

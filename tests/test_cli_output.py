"""The CLI never hands the terminal a control sequence from the database.

Every string that status, update-status and doctor print comes from a database whose contents
another role may have chosen: table and trigger names, owner labels, resource names (a
superuser, or an older release, can put anything in them). With hostile text in every field
those commands print, stdout and stderr hold no control, format or separator character but the
line breaks, and each hostile string is shown escaped (pgfence.cli.shown). The negative control
prints the same rows through a table() without the helper.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pgfence import cli
from testkit.harness import Database
from tests.support import HUNG

# An escape that clears the screen, an OSC that retitles the terminal, a bidi override, a
# carriage return that overwrites the line, a tag character.
HOSTILE = "x\x1b[2J\x1b]0;pwned\x07\u202e\r\U000e0041y"


def hostile_database(db: Database) -> uuid.UUID:
    """Hostile text in every field the commands print; the open window's token."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.acquire('r', 'w', '1 hour')")
    # As a superuser can (the functions would refuse these): past every check.
    db.sql("update pgfence.leases set owner = %s", (HOSTILE,))
    db.sql(f'create table "{HOSTILE}" (id int)')
    db.sql("select pgfence.protect(%s::regclass, 'r')", (f'"{HOSTILE}"',))
    db.sql(f'alter table "{HOSTILE}" rename to "{HOSTILE}2"')
    db.sql(f'alter table "{HOSTILE}2" disable trigger pgfence_guard')
    token = db.one("select pgfence.prepare_update(array['r'], gen_random_uuid())")
    db.sql("insert into pgfence.resources (resource, enabled) values (%s, true)", (HOSTILE,))
    db.sql("insert into pgfence.update_items (token, resource, saved_enabled, enabled_version, "
           "pending_invocations) values (%s, %s, true, 0, 0)", (token, HOSTILE))
    return uuid.UUID(str(token))


def run(db: Database, *args: str) -> tuple[int, str, str]:
    dbname = db.one("select current_database()")
    url = f"postgresql://postgres@127.0.0.1:{os.environ['PGPORT']}/{dbname}"
    p = subprocess.run([sys.executable, "-m", "pgfence.cli", "--db-url", url, *args],
                       capture_output=True, text=True, timeout=HUNG)
    return p.returncode, p.stdout, p.stderr


def raw(text: str) -> list[str]:
    """The characters a terminal would act on."""
    return [repr(c) for c in text if not (c.isprintable() or c == "\n")]


@pytest.mark.parametrize("command", ["status", "update-status", "doctor"])
def test_hostile_names_reach_the_terminal_escaped(db: Database, command: str) -> None:
    token = hostile_database(db)
    args = {"status": ["status"], "update-status": ["workers", "update-status", str(token)],
            "doctor": ["doctor"]}[command]
    code, out, err = run(db, *args)
    assert code in (0, 1), err
    assert raw(out) == [] and raw(err) == [], (out, err)
    assert cli.shown(HOSTILE) in out, out
    assert "\\x1b[2J" in out


def test_negative_control_a_table_without_the_helper_passes_them_through() -> None:
    rows = [{"owner": HOSTILE}]
    assert raw(cli.table(rows)) == []
    unescaped = "\n".join(str(r["owner"]) for r in rows)
    assert raw(unescaped) != []


def test_shown_escapes_every_unprintable_character_and_backslashes() -> None:
    assert cli.shown("a\\b\x1b\u202e\U000e0041 é") == "a\\\\b\\x1b\\u202e\\U000e0041 é"
    assert cli.shown("two\nlines\x07", lines=True) == "two\nlines\\x07"
    everything = "".join(chr(c) for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF)
    assert raw(cli.shown(everything)) == []


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_status_shows_the_counters(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    first = db.one("select lease_id from pgfence.acquire('r', 'w', '1 minute')")
    db.sql("select pgfence_test.expire(%s)", (first,))
    db.sql("select pgfence.acquire('r', 'w2', '1 minute')")
    code, out, _ = run(db, "--json", "status")
    assert code == 0
    (row,) = json.loads(out)["counters"]
    assert {k: row[k] for k in ("resource", "generation", "lease_state", "takeovers")} == {
        "resource": "r", "generation": 2, "lease_state": "current", "takeovers": 1}
    assert str(first) not in out
    code, out, _ = run(db, "status")
    assert "counters:" in out and "takeovers" in out

"""How the CLI reaches a database: directly (psycopg) or through the Supabase CLI.

Both run one statement per call and return rows as dicts of JSON values, or run whole SQL
scripts (pgfence's install and upgrade files) in one transaction: all of it commits, or none.
Failures are sorted into two kinds, which the CLI maps to exit codes: the database refused
(``Refused``, exit 1) or the database could not be reached or gave no usable answer
(``TransportFailure``, exit 3).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from pgfence.sql import literal

SUPABASE_MIN_VERSION = (3, 0, 0)     # the first release with `db query`
SUPABASE_TESTED_VERSIONS = ("3.1.0",)
LINKED = "@linked"                    # --remote without a value: the linked project

# Variables that could answer Supabase's confirmation prompt for us. pgfence asks its own
# question and forwards --yes only after the operator answered it.
_CONFIRMATION_BYPASS = re.compile(r"SUPABASE_(.*_)?(YES|ASSUME_YES|CONFIRM|NO_CONFIRM|FORCE)")

Rows = list[dict[str, Any]]
_REFUSALS = {"PF", "22", "23", "25", "42", "P0"}
# For a script, every error is the database's answer except a lost or refused connection, an
# operator's intervention (shutdown, cancel), exhausted resources and internal errors.
_SCRIPT_FAILURES = {"08", "53", "57", "58", "XX"}


class Refused(Exception):
    """The database refused the statement (a pgfence error, a conflict)."""


class TransportFailure(Exception):
    """The database could not be reached, or the answer could not be read."""


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Removes connection URLs, passwords and given secrets from text meant for people."""
    text = re.sub(r"postgres(?:ql)?://\S+", "<database url>", text)
    text = re.sub(r"(password\s*=\s*)\S+", r"\1***", text, flags=re.I)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def url_target(url: str) -> tuple[str, str]:
    """(target name, password) of a database URL or conninfo string. Never shows the password."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise TransportFailure("the database URL cannot be parsed") from None
    host = str(parts.get("host") or "localhost")
    port = str(parts.get("port") or "5432")
    dbname = str(parts.get("dbname") or parts.get("user") or "postgres")
    return f"{host}:{port}/{dbname}", str(parts.get("password") or "")


def masked_url(url: str) -> str:
    """The URL for a command line shown to the operator, with its password replaced by ***."""
    split = urlsplit(url)
    if split.scheme and split.password:
        return url.replace(f":{split.password}@", ":***@", 1)
    if not split.scheme:
        return re.sub(r"(password\s*=\s*)\S+", r"\1***", url)
    return url


class Direct:
    """psycopg 3, no prepared statements and no session state: works through a pooler."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.target, self._password = url_target(url)

    def query(self, sql: str, *, read_only: bool) -> Rows:
        try:
            conn = psycopg.connect(self.url, prepare_threshold=None, connect_timeout=15,
                                   application_name="pgfence-cli", row_factory=dict_row)
        except psycopg.Error as e:
            raise TransportFailure(redact(str(e), (self._password,))) from None
        try:
            with conn:
                conn.read_only = read_only       # BEGIN READ ONLY for status reads
                return [{k: _plain(v) for k, v in row.items()} for row in conn.execute(sql)]
        except psycopg.Error as e:
            # What pgfence or the SQL raised is a refusal; a lost connection, a shutdown or a
            # serialization failure is the transport's (the same request may be retried).
            if e.sqlstate and e.sqlstate[:2] in _REFUSALS:
                raise Refused(redact(_message(e), (self._password,))) from None
            raise TransportFailure(redact(str(e), (self._password,))) from None
        finally:
            conn.close()

    def run_script(self, scripts: Sequence[str]) -> None:
        """Runs the scripts one after the other in one transaction (BEGIN ... COMMIT): all of
        them commit, or nothing does. A script without parameters goes by the simple query
        protocol, which takes several statements at once, as psql sends a file."""
        try:
            conn = psycopg.connect(self.url, prepare_threshold=None, connect_timeout=15,
                                   application_name="pgfence-cli")
        except psycopg.Error as e:
            raise TransportFailure(redact(str(e), (self._password,))) from None
        try:
            with conn.cursor() as cur:
                for script in scripts:
                    cur.execute(script)
            conn.commit()
        except psycopg.Error as e:
            if e.sqlstate and e.sqlstate[:2] not in _SCRIPT_FAILURES:
                raise Refused(redact(_message(e), (self._password,))) from None
            raise TransportFailure(redact(str(e), (self._password,))) from None
        finally:
            conn.close()            # without a commit, the server rolls the transaction back


def _message(e: psycopg.Error) -> str:
    diag = e.diag
    text = diag.message_primary or str(e)
    if diag.message_hint:
        text += f" (hint: {diag.message_hint})"
    return f"{e.sqlstate}: {text}" if e.sqlstate else text


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)


@dataclass
class Supabase:
    """The installed `supabase` CLI: `supabase db query --output-format json`, argv only."""

    binary: str
    remote: str | None              # None: the local stack; LINKED, a ref/branch, or a URL
    timeout: float = 120.0

    def __post_init__(self) -> None:
        self._password = ""
        if self.remote is None:
            self.target = "local"
        elif self.remote == LINKED:
            self.target = _linked_ref() or "linked project"
        elif "://" in self.remote:
            self.target, self._password = url_target(self.remote)
        else:
            self.target = self.remote
        self._checked = False
        self._has_file = False

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        path = shutil.which(self.binary)
        if path is None:
            raise TransportFailure(
                f"the Supabase CLI was not found ({self.binary!r}): install it, e.g. "
                f"`npm install supabase@{SUPABASE_TESTED_VERSIONS[-1]}`, or pass --supabase-bin")
        env = {k: v for k, v in os.environ.items() if not _CONFIRMATION_BYPASS.fullmatch(k)}
        try:
            return subprocess.run([path, *args], capture_output=True, text=True, env=env,
                                  timeout=self.timeout, shell=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportFailure(
                f"the Supabase CLI did not answer in {self.timeout:.0f} s") from None
        except OSError as e:
            raise TransportFailure(f"the Supabase CLI could not be run: {e.strerror}") from None

    def check(self) -> None:
        """Refuses a missing, too old, or incapable Supabase CLI before any query."""
        if self._checked:
            return
        out = self._run(["--version"])
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout)
        if out.returncode != 0 or not match:
            raise TransportFailure("the Supabase CLI did not report its version")
        version = tuple(int(x) for x in match.groups())
        if version < SUPABASE_MIN_VERSION:
            raise TransportFailure(
                f"the Supabase CLI is {match.group(0)}; pgfence needs "
                f"{'.'.join(map(str, SUPABASE_MIN_VERSION))} or newer (`db query` with JSON "
                f"output); tested with {', '.join(SUPABASE_TESTED_VERSIONS)}")
        helptext = self._run(["db", "query", "--help"]).stdout
        missing = [f for f in ("--remote", "--read-only", "--output-format") if f not in helptext]
        if missing:
            raise TransportFailure(f"this Supabase CLI's `db query` lacks {', '.join(missing)}")
        self._has_file = "--file" in helptext
        self._checked = True

    def query(self, sql: str, *, read_only: bool, confirmed: bool = False) -> Rows:
        self.check()
        args = ["db", "query", "--output-format", "json", "--agent", "no"]
        if self.remote is not None:
            args.append("--remote" if self.remote == LINKED else f"--remote={self.remote}")
        if read_only:
            args.append("--read-only")
        elif confirmed:
            args.append("--yes")         # only after pgfence's own confirmation
        else:
            raise AssertionError("a mutation through Supabase needs the operator's confirmation")
        out = self._run([*args, sql])
        doc = self._answer(out)
        if out.returncode != 0 or not isinstance(doc, list):
            raise TransportFailure(
                f"unexpected answer from the Supabase CLI (exit {out.returncode})")
        return [{k: _plain(v) for k, v in row.items()} for row in doc]

    def run_script(self, scripts: Sequence[str]) -> None:
        """Runs the scripts, in order, in one transaction: all of them commit, or nothing does.

        `supabase db query` runs exactly one statement per call (its driver prepares it: several
        statements are refused, from an argument, --file or stdin alike) and wraps it in a
        transaction of its own. So the scripts travel as one DO block that EXECUTEs each of
        them (EXECUTE takes several statements), inside that one transaction; and by --file,
        because Linux caps one argv string at 128 KiB and an install file may grow past it.
        """
        self.check()
        if not self._has_file:
            raise TransportFailure("this Supabase CLI's `db query` lacks --file, which pgfence "
                                   "needs to send a whole install or upgrade script")
        body = "begin\n" + "".join(f"execute {literal(s)};\n" for s in scripts) + "end"
        args = ["db", "query", "--output-format", "json", "--agent", "no"]
        if self.remote is not None:
            args.append("--remote" if self.remote == LINKED else f"--remote={self.remote}")
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", prefix="pgfence-",
                                         suffix=".sql") as f:
            f.write(f"do {literal(body)}\n")
            f.flush()
            out = self._run([*args, "--yes", "--file", f.name])   # after pgfence's confirmation
        # A statement without rows answers with its command tag, not JSON.
        if out.returncode == 0 and out.stdout.strip() == "DO":
            return
        self._answer(out)
        raise TransportFailure(f"unexpected answer from the Supabase CLI (exit {out.returncode})")

    def _answer(self, out: subprocess.CompletedProcess[str]) -> Any:
        """The CLI's JSON answer; raises Refused or TransportFailure for its errors."""
        secrets = (self._password,)
        if out.returncode < 0:
            raise TransportFailure(f"the Supabase CLI was killed by signal "
                                   f"{signal.Signals(-out.returncode).name}")
        try:
            doc = json.loads(out.stdout)
        except ValueError:
            detail = redact((out.stderr or out.stdout).strip()[-500:], secrets)
            raise TransportFailure(f"the Supabase CLI gave no JSON answer (exit {out.returncode})"
                                   + (f": {detail}" if detail else "")) from None
        if isinstance(doc, dict) and doc.get("_tag") == "Error":
            error = doc.get("error") or {}
            text = redact(f"{error.get('code', 'Error')}: {error.get('message', '')}", secrets)
            if error.get("suggestion"):
                text += f" ({redact(str(error['suggestion']), secrets)})"
            if error.get("code") == "DbQueryExecError":
                raise Refused(text)
            raise TransportFailure(text)
        return doc


def _linked_ref() -> str | None:
    """The project ref `supabase link` recorded, searching upward like the Supabase CLI."""
    for folder in [Path.cwd(), *Path.cwd().parents]:
        ref = folder / "supabase" / ".temp" / "project-ref"
        if ref.is_file():
            return ref.read_text().strip() or None
    return None

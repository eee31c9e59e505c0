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
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from pgfence.sql import BadInput, literal

SUPABASE_MIN_VERSION = (3, 0, 0)     # the first release with `db query`
SUPABASE_TESTED_VERSIONS = ("3.1.0",)
LINKED = "@linked"                    # --remote without a value: the linked project
# What printed commands say instead of the URL the operator gave: pgfence never prints one.
URL_PLACEHOLDER = '"$DATABASE_URL"'
# A Supabase project ref, as the Supabase CLI tells one from a branch name.
PROJECT_REF = re.compile(r"[a-z]{20}")

# Variables that could answer Supabase's confirmation prompt for us. pgfence asks its own
# question and forwards --yes only after the operator answered it.
_CONFIRMATION_BYPASS = re.compile(r"SUPABASE_.*YES.*|.*CONFIRM.*|.*FORCE.*", re.IGNORECASE)
# Variables by which the Supabase CLI would pick its project and folder itself: pgfence passes
# what it resolved (and showed) as --workdir and --remote=REF instead.
_PINNED = ("SUPABASE_PROJECT_ID", "SUPABASE_WORKDIR")
# libpq's parameters that hold secrets.
_SECRET_PARAMETERS = ("password", "sslpassword")

Rows = list[dict[str, Any]]
_REFUSALS = {"PF", "22", "23", "25", "42", "P0"}
# For a script, every error is the database's answer except a lost or refused connection, an
# operator's intervention (shutdown, cancel), exhausted resources and internal errors.
_SCRIPT_FAILURES = {"08", "53", "57", "58", "XX"}


class Refused(Exception):
    """The database refused the statement (a pgfence error, a conflict): ``text`` is what it
    said (the message and its detail), ``hint`` its hint, ``sqlstate`` its code. The direct
    transport carries all three; the Supabase CLI 3.1.0 passes on the message alone
    (tests/test_cli.py), so there ``sqlstate`` and ``hint`` are None."""

    def __init__(self, text: str, sqlstate: str | None = None, hint: str | None = None) -> None:
        super().__init__(text + (f" (hint: {hint})" if hint else ""))
        self.text, self.sqlstate, self.hint = text, sqlstate, hint


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


@dataclass(frozen=True)
class Conninfo:
    """What pgfence may show of a database URL or conninfo string, and what it must hide."""

    name: str                    # host:port/dbname, libpq's environment defaults applied
    password: str                # the password the string carries ('' if none)
    secrets: tuple[str, ...]     # every secret the string or the environment carries


def describe(url: str, env: Mapping[str, str] = os.environ) -> Conninfo:
    """The target a URL or conninfo string names, the way libpq resolves it (what is not in the
    string comes from PGHOST, PGPORT, PGDATABASE, PGUSER). Only host, port and database are
    ever shown; every other parameter (user, passfile, sslpassword, ...) stays out of output.
    Raises BadInput for a string that cannot be parsed, or whose database a service file
    (pg_service.conf) would choose: pgfence cannot show that one."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # Its message quotes the string, which may hold the password.
        raise BadInput("the database URL cannot be parsed") from None

    def value(key: str, envvar: str) -> str:
        return str(parts.get(key) or env.get(envvar) or "")

    if (parts.get("service") or env.get("PGSERVICE")) and not all(
            parts.get(k) for k in ("host", "port", "dbname")):
        raise BadInput("the database URL leaves its host, port or database to a service file "
                       "(service=, PGSERVICE): give all three, so that pgfence can show which "
                       "database it changes")
    hosts = (value("hostaddr", "PGHOSTADDR") or value("host", "PGHOST") or "localhost").split(",")
    ports = (value("port", "PGPORT") or "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    dbname = (value("dbname", "PGDATABASE") or value("user", "PGUSER")
              or pwd.getpwuid(os.geteuid()).pw_name)
    where = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False))
    secrets = {str(parts[k]) for k in _SECRET_PARAMETERS if parts.get(k)}
    userinfo = urlsplit(url).password if "://" in url else None
    secrets |= {userinfo, unquote(userinfo)} if userinfo else set()
    secrets |= {env["PGPASSWORD"]} if env.get("PGPASSWORD") else set()
    secrets |= {quote(x, safe="") for x in secrets}
    return Conninfo(f"{where}/{dbname}", str(parts.get("password") or ""),
                    tuple(sorted(secrets, key=len, reverse=True)))


def without_password(url: str) -> str:
    """A database URL without its password (userinfo or ?password=), for the Supabase CLI's
    argv, which any user can read in ps; the password goes in PGPASSWORD. Refuses (BadInput)
    another secret parameter, which the Supabase CLI could only get on its argv."""
    split = urlsplit(url)
    params = [p for p in split.query.split("&") if p]
    for secret in _SECRET_PARAMETERS[1:]:
        if any(unquote(p.partition("=")[0]) == secret for p in params):
            raise BadInput(f"--remote: the URL has an {secret} parameter, which pgfence cannot "
                           "pass to the Supabase CLI without putting it on a command line; "
                           "connect with --db-url instead")
    userinfo, at, hosts = split.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{hosts}" if at else split.netloc
    query = "&".join(p for p in params if unquote(p.partition("=")[0]) != "password")
    return urlunsplit((split.scheme, netloc, split.path, query, split.fragment))


class Direct:
    """psycopg 3, no prepared statements and no session state: works through a pooler."""

    def __init__(self, url: str) -> None:
        self.url = url
        conninfo = describe(url)
        self.target = self.shown = conninfo.name
        self.command_args = f"--db-url {URL_PLACEHOLDER}"
        self._secrets = conninfo.secrets

    def query(self, sql: str, *, read_only: bool) -> Rows:
        try:
            conn = psycopg.connect(self.url, prepare_threshold=None, connect_timeout=15,
                                   application_name="pgfence-cli", row_factory=dict_row)
        except psycopg.Error as e:
            raise TransportFailure(redact(str(e), self._secrets)) from None
        try:
            with conn:
                conn.read_only = read_only       # BEGIN READ ONLY for status reads
                return [{k: _plain(v) for k, v in row.items()} for row in conn.execute(sql)]
        except psycopg.Error as e:
            # What pgfence or the SQL raised is a refusal; a lost connection, a shutdown or a
            # serialization failure is the transport's (the same request may be retried).
            if e.sqlstate and e.sqlstate[:2] in _REFUSALS:
                raise self._refused(e) from None
            raise TransportFailure(redact(str(e), self._secrets)) from None
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
            raise TransportFailure(redact(str(e), self._secrets)) from None
        try:
            with conn.cursor() as cur:
                for script in scripts:
                    cur.execute(script)
            conn.commit()
        except psycopg.Error as e:
            if e.sqlstate and e.sqlstate[:2] not in _SCRIPT_FAILURES:
                raise self._refused(e) from None
            raise TransportFailure(redact(str(e), self._secrets)) from None
        finally:
            conn.close()            # without a commit, the server rolls the transaction back

    def _refused(self, e: psycopg.Error) -> Refused:
        diag = e.diag
        text = diag.message_primary or str(e)
        if diag.message_detail:
            text += f" ({diag.message_detail})"
        hint = redact(diag.message_hint, self._secrets) if diag.message_hint else None
        return Refused(redact(f"{e.sqlstate}: {text}", self._secrets), e.sqlstate, hint)


def _plain(value: Any) -> Any:
    """A column's value as JSON has it: json and jsonb stay objects and arrays (psycopg parses
    them, as the Supabase CLI's JSON does); other types (timestamps, uuids) become text."""
    if value is None or isinstance(value, bool | int | float | str | dict | list):
        return value
    return str(value)


@dataclass
class Supabase:
    """The installed `supabase` CLI: `supabase db query --output-format json`, argv only."""

    binary: str
    remote: str | None              # None: the local stack; LINKED, a ref/branch, or a URL
    timeout: float = 120.0
    # Around each call (seconds each): the CLI shows a progress line on a terminal.
    progress: Callable[[], AbstractContextManager[object]] = nullcontext

    def __post_init__(self) -> None:
        """Resolves the target as the Supabase CLI would, then pins it: every call gets
        --workdir and, for a project, --remote=REF, so what the operator confirmed is what the
        CLI uses."""
        self._password = ""
        self._secrets: tuple[str, ...] = ()
        self.workdir = supabase_workdir()
        self._remote: str | None = None          # the --remote value the CLI gets
        if self.remote is None:
            self.target, self.shown = "local", f"local (the local stack of {self.workdir})"
            self.command_args = "--supabase"
            return
        if self.remote == LINKED:
            self.target, origin = linked_ref(self.workdir)
            self.shown = f"{self.target} (the project {origin})"
        elif self.remote.startswith(("postgresql://", "postgres://")):
            conninfo = describe(self.remote)
            self.target = self.shown = conninfo.name
            self._password, self._secrets = conninfo.password, conninfo.secrets
            self._remote = without_password(self.remote)
            self.command_args = f"--supabase --remote={URL_PLACEHOLDER}"
            return
        elif PROJECT_REF.fullmatch(self.remote):
            self.target = self.shown = self.remote
        elif "=" in self.remote or ":" in self.remote:
            # Not echoed: a conninfo string may hold a password.
            raise BadInput("--remote takes a project ref or a database URL (a conninfo string "
                           "goes with --db-url)")
        else:
            raise BadInput(f"--remote={self.remote}: not a project ref (20 lowercase letters), "
                           "so the Supabase CLI would take it for a branch name and look it up "
                           "through its API, which pgfence cannot show you before it runs; pass "
                           "the branch's own project ref (`supabase branches list`)")
        self._remote = self.target
        self.command_args = f"--supabase --remote={self.target}"

    def _run(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        path = shutil.which(self.binary)
        if path is None:
            raise TransportFailure(
                f"the Supabase CLI was not found ({self.binary!r}): install it, e.g. "
                f"`npm install supabase@{SUPABASE_TESTED_VERSIONS[-1]}`, or pass --supabase-bin")
        env = {k: v for k, v in os.environ.items()
               if not _CONFIRMATION_BYPASS.fullmatch(k) and k not in _PINNED}
        if self._password:
            env["PGPASSWORD"] = self._password      # not on the argv, which ps shows
        try:
            with self.progress():
                return subprocess.run([path, *args], capture_output=True, text=True, env=env,
                                      timeout=self.timeout, shell=False,
                                      stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TransportFailure(
                f"the Supabase CLI did not answer in {self.timeout:.0f} s") from None
        except OSError as e:
            raise TransportFailure(f"the Supabase CLI could not be run: {e.strerror}") from None

    def diagnose(self) -> None:
        """Raises, naming why, for a Supabase CLI too old or lacking a flag pgfence passes.

        Run only after a call gave no JSON answer, not before every query: each call of that
        CLI costs over a second of CPU, and a CLI that lacks a command or flag refuses the
        whole call before it runs anything (it parses its flags first; 3.1.0 prints its help),
        so a first query is safe to try."""
        out = self._run(["--version"])
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout)
        if out.returncode != 0 or not match:
            raise TransportFailure("the Supabase CLI did not report its version")
        if tuple(int(x) for x in match.groups()) < SUPABASE_MIN_VERSION:
            raise TransportFailure(
                f"the Supabase CLI is {match.group(0)}; pgfence needs "
                f"{'.'.join(map(str, SUPABASE_MIN_VERSION))} or newer (`db query` with JSON "
                f"output); tested with {', '.join(SUPABASE_TESTED_VERSIONS)}")
        helptext = self._run(["db", "query", "--help"]).stdout
        missing = [f for f in ("--remote", "--read-only", "--output-format", "--file")
                   if f not in helptext]
        if missing:
            raise TransportFailure(f"this Supabase CLI's `db query` lacks {', '.join(missing)}, "
                                   "which pgfence needs")

    def query(self, sql: str, *, read_only: bool, confirmed: bool = False) -> Rows:
        args = self._query_args()
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
        body = "begin\n" + "".join(f"execute {literal(s)};\n" for s in scripts) + "end"
        args = self._query_args()
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

    def _query_args(self) -> list[str]:
        args = ["db", "query", "--output-format", "json", "--agent", "no",
                "--workdir", str(self.workdir)]
        return args if self._remote is None else [*args, f"--remote={self._remote}"]

    def _answer(self, out: subprocess.CompletedProcess[str]) -> Any:
        """The CLI's JSON answer; raises Refused or TransportFailure for its errors."""
        secrets = self._secrets
        if out.returncode < 0:
            raise TransportFailure(f"the Supabase CLI was killed by signal "
                                   f"{signal.Signals(-out.returncode).name}")
        try:
            doc = json.loads(out.stdout)
        except ValueError:
            self.diagnose()
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


def supabase_workdir(env: Mapping[str, str] = os.environ) -> Path:
    """The folder whose supabase/ the Supabase CLI reads, found as the Supabase CLI 3.1.0 finds
    it: SUPABASE_WORKDIR (relative to the current directory, used exactly as given), else the
    nearest folder upward with a supabase/config.toml (or config.json, config.jsonc), else the
    current directory. tests/test_cli.py checks this against the real CLI."""
    cwd = Path.cwd()
    if env.get("SUPABASE_WORKDIR"):
        return Path(os.path.normpath(cwd / env["SUPABASE_WORKDIR"]))
    for folder in [cwd, *cwd.parents]:
        if any((folder / "supabase" / config).exists()
               for config in ("config.json", "config.jsonc", "config.toml")):
            return folder
    return cwd


def linked_ref(workdir: Path, env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(ref, where it came from) of the linked project, as the Supabase CLI finds it:
    SUPABASE_PROJECT_ID, else the workdir's supabase/.temp/project-ref (what `supabase link`
    writes). Both there and different: ambiguous, refused (BadInput), as is a name that is not a
    ref. Neither: not linked (TransportFailure, as the Supabase CLI's own error would be)."""
    link = workdir / "supabase" / ".temp" / "project-ref"
    try:
        linked = link.read_text().strip() if link.is_file() else ""
    except OSError as e:
        raise TransportFailure(f"{link} cannot be read: {e.strerror}") from None
    named = env.get("SUPABASE_PROJECT_ID", "")
    if named and not PROJECT_REF.fullmatch(named):
        raise BadInput("SUPABASE_PROJECT_ID is not a project ref (20 lowercase letters)")
    if linked and not PROJECT_REF.fullmatch(linked):
        raise BadInput(f"{link} does not hold a project ref (20 lowercase letters): run "
                       "`supabase link` again, or pass --remote=REF")
    if named and linked and named != linked:
        raise BadInput(f"SUPABASE_PROJECT_ID names project {named}, but {link} links {linked}: "
                       "which one is meant is ambiguous; unset SUPABASE_PROJECT_ID, or pass "
                       "--remote=REF")
    if named:
        return named, "named by SUPABASE_PROJECT_ID"
    if linked:
        return linked, f"linked in {workdir}"
    raise TransportFailure(f"no linked project: SUPABASE_PROJECT_ID is not set and there is no "
                           f"{link} (run `supabase link`, or pass --remote=REF)")

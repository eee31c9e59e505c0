"""pgfence: operator commands for update windows, over a direct connection or the Supabase CLI.

The protocol lives in SQL (pgfence.prepare_update, update_status, finish_update, and the
install and upgrade files this package carries); this is a thin caller: it resolves the
target, asks the operator to confirm it, calls the functions or runs the files in one
transaction, and renders what they return.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pgfence import __version__, init, sql
from pgfence.releases import VERSION, BrokenPackage, Files, Upgrade, key
from pgfence.transport import (
    LINKED,
    Direct,
    Refused,
    Rows,
    Supabase,
    TransportFailure,
)

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_TRANSPORT, EXIT_UNCONFIRMED, EXIT_GAVE_UP = range(6)
PREPARE_ATTEMPTS = 3
POLL_SECONDS = 2.0             # --wait: between two looks at update_status
ERASE = "\x1b[K"               # erases a progress line on the terminal

EPILOG = """\
target (exactly one, never a default; before or after the command):
  --db-url URL                a PostgreSQL URL or conninfo string, reached with psycopg
  --supabase                  the local Supabase stack, through the installed `supabase` CLI
  --supabase --remote         the linked project (SUPABASE_PROJECT_ID, else supabase link's)
  --supabase --remote=REF|URL a project ref (a branch by its own ref) or a database URL
(init writes files and connects to nothing: it takes no target)

Output never shows a URL or a password, only the target (host:port/db, a project ref, or
local); the commands it prints for later say "$DATABASE_URL" where your URL goes. With --json,
stdout is one JSON document, errors too: {"error", "sqlstate", "target", "exit_code", ...}.

Mutations (install, upgrade, prepare-update, finish-update, set-enabled, deprecate, prune) show
the resolved target and need the operator to confirm it: typed at the prompt, or --confirm
TARGET. No environment variable bypasses that. install and upgrade run their SQL in one
transaction: all of it, or nothing.

exit codes:
  0  done (also: upgrade with nothing to do; doctor: healthy, warnings aside)
  1  the database refused (unknown token, overlap, conflict, not current, permission denied;
     pgfence already installed, not installed, newer than this package, or an install/upgrade
     file failed); doctor: a check failed; init: a file in the way (not written by init, or
     changed since), or a path outside the project: nothing written
  2  usage or bad input (also: an upgrade --to a release this package does not know; init:
     no such DIR, no DIR/supabase, an unknown layer)
  3  transport or connection failure
  4  confirmation missing or wrong
  5  workers update-status --wait gave up (--timeout) before every resource was drained
"""


class Exit(Exception):
    def __init__(self, code: int, message: str, sqlstate: str | None = None,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.sqlstate, self.extra = code, message, sqlstate, extra


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One "pgfence:" (main's), then the words of the subcommand that refused.
        words = self.prog.removeprefix("pgfence").strip()
        raise Exit(EXIT_USAGE, f"{words}: {message}" if words else message,
                   usage=self.format_usage().strip())


# The options that choose the target and the output, accepted before the command and after it
# (`pgfence status --db-url URL --json`). After it they land in late_<dest> and are merged by
# merge_late, which refuses one given twice with two values.
TARGET_OPTIONS = ("db_url", "supabase", "remote", "supabase_bin", "json")


def add_target_options(p: argparse.ArgumentParser, late: bool) -> None:
    def dest(name: str) -> dict[str, Any]:
        return {"dest": f"late_{name}", "default": argparse.SUPPRESS} if late else {}
    target = p.add_mutually_exclusive_group()
    target.add_argument("--db-url", metavar="URL", help="PostgreSQL URL or conninfo string",
                        **dest("db_url"))
    target.add_argument("--supabase", action="store_true", help="use the Supabase CLI",
                        **dest("supabase"))
    p.add_argument("--remote", metavar="REF|URL", nargs="?",
                   help="with --supabase: the linked project, or --remote=REF|URL",
                   **dest("remote"))
    p.add_argument("--supabase-bin", metavar="PATH",
                   help="the Supabase CLI to run (default: `supabase` on PATH)",
                   **(dest("supabase_bin") if late else {"default": "supabase"}))
    p.add_argument("--json", action="store_true",
                   help="print one JSON document on stdout and nothing else", **dest("json"))


def merge_late(args: argparse.Namespace) -> None:
    for name in TARGET_OPTIONS:
        if f"late_{name}" not in vars(args):
            continue
        late, early = vars(args).pop(f"late_{name}"), getattr(args, name)
        if isinstance(late, bool):                          # --supabase, --json
            setattr(args, name, early or late)
            continue
        if early not in (None, late) and not (name == "supabase_bin" and early == "supabase"):
            raise Exit(EXIT_USAGE, f"--{name.replace('_', '-')} is given twice, with two "
                                   "values")
        setattr(args, name, late)
    if args.db_url and args.supabase:
        raise Exit(EXIT_USAGE, "argument --supabase: not allowed with argument --db-url")


def build_parser() -> Parser:
    parser = Parser(prog="pgfence", description=__doc__.split("\n")[0] if __doc__ else None,
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"pgfence {__version__}",
                        help="this package's version, and exit")
    add_target_options(parser, late=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=Parser)

    def command(words: Any, name: str, mutation: bool = False, **kw: Any) -> Parser:
        p: Parser = words.add_parser(name, **kw)
        add_target_options(p, late=True)
        if mutation:
            p.add_argument("--confirm", metavar="TARGET",
                           help="the resolved target, to confirm")
        return p

    command(commands, "status", help="resources, owners and open windows (read-only)")
    doctor = command(commands, "doctor", help="pgfence.health(): every check of this "
                     "installation (read-only; exit 1 when one fails)")
    doctor.add_argument("--requeue-elsewhere", action="store_true",
                        help="pgfence.requeue_expired() is scheduled by something other than "
                             "pg_cron (a timer, a worker): its check counts as passed")
    command(commands, "version", help="the installed pgfence release and this package's "
                                      "(read-only)")
    install = command(
        commands, "install", mutation=True,
        help="install a pgfence release (default: the newest) into a database without it",
        description="Runs the package's sql/pgfence.sql (or, with --to, an older release's "
                    "sql/releases/pgfence--X.sql) in one transaction. A database that already "
                    "has a schema pgfence is left as it is (exit 1): use upgrade.")
    install.add_argument("--to", metavar="VERSION",
                         help="the release to install (default: the newest this package has)")
    upgrade = command(
        commands, "upgrade", mutation=True,
        help="upgrade pgfence to a newer release, keeping every lease and task",
        description="Runs the package's upgrade files (sql/upgrades/pgfence--A--B.sql) from the "
                    "installed release to the target release, all in one transaction. Nothing "
                    "to do when the database has the target release already (exit 0).")
    upgrade.add_argument("--to", metavar="VERSION",
                         help="the release to upgrade to (default: the newest this package has)")
    prune = command(commands, "prune", mutation=True,
                    help="pgfence.prune(): delete history older than a bound, never live state")
    prune.add_argument("--older-than", metavar="D",
                       help="the bound: seconds, or 90m, 12h, 7d (default: prune's, 7 days; "
                            "at least 1 hour)")
    workers = commands.add_parser("workers", help="update windows and resources for "
                                                  "deploying worker code")
    window = workers.add_subparsers(dest="action", metavar="ACTION", required=True,
                                    parser_class=Parser)
    prepare = command(
        window, "prepare-update", mutation=True,
        help="pause resources: save enabled, disable, drain",
        description="Opens an update window. The request id makes a retry safe: the same "
                    "request id and resources return the same window, never re-saving state.")
    prepare.add_argument("resources", nargs="+", metavar="RESOURCE")
    prepare.add_argument("--request-id", metavar="UUID", help="default: a new one, printed")
    status = command(window, "update-status", help="what is still running (read-only)")
    status.add_argument("token")
    status.add_argument("--wait", action="store_true",
                        help="look again every few seconds until every resource is drained "
                             "(exit 0); progress on stderr when it is a terminal")
    status.add_argument("--timeout", metavar="D",
                        help="with --wait: give up after D (seconds, or 90s, 15m, 2h): exit 5")
    finish = command(window, "finish-update", mutation=True,
                     help="restore exactly what prepare saved")
    finish.add_argument("token")
    enable = command(window, "set-enabled", mutation=True,
                     help="enable or disable a resource (pgfence.set_enabled)")
    enable.add_argument("resource", metavar="RESOURCE")
    enable.add_argument("enabled", choices=["true", "false"])
    deprecate = command(window, "deprecate", mutation=True,
                        help="drain a resource's current lease without disabling it "
                             "(pgfence.deprecate): a successor may start at once")
    deprecate.add_argument("resource", metavar="RESOURCE")
    add_init(commands)
    return parser


def add_init(commands: Any) -> None:
    """`pgfence init`: files only, no database, so no target (and no confirmation)."""
    p = commands.add_parser(
        "init", help="write pgfence's migrations and Deno client into your project",
        description="Writes pgfence's migrations (dated after the project's last one: pgfence, "
                    "the chosen layers, the grants, the pg_cron jobs) and the Deno client with "
                    "an example worker into an existing project. Idempotent; never overwrites "
                    "a file it did not write, nor one of its own that was changed since (exit 1, "
                    "nothing written). Connects to no database: apply the migrations yourself.")
    layout = p.add_mutually_exclusive_group(required=True)
    # SUPPRESS: these share their names with the top-level flags, which they must not reset.
    layout.add_argument("--supabase", action="store_true", default=argparse.SUPPRESS,
                        help="a Supabase project: DIR/supabase/migrations, supabase/functions")
    layout.add_argument("--plain", action="store_true",
                        help="any project: DIR/pgfence/migrations/NNNN_*.sql, DIR/pgfence/deno")
    p.add_argument("dir", nargs="?", default=".", metavar="DIR",
                   help="the project's directory (default: the current one)")
    p.add_argument("--layers", metavar="LIST",
                   help=f"comma-separated optional layers: {', '.join(init.LAYERS)}")
    p.add_argument("--role", metavar="NAME",
                   help="the role granted pgfence_worker (default with --supabase: "
                        "service_role; with --plain: none, no grants migration: the role that "
                        "runs the migrations owns pgfence)")
    p.add_argument("--no-cron", action="store_true",
                   help="leave out the pg_cron jobs (requeue, prune): schedule them yourself")
    p.add_argument("--supervise", metavar="RESOURCE",
                   help="with --supabase: a pg_cron + pg_net job that starts the example worker "
                        "function for RESOURCE when its queue has work (startup handshake; the "
                        "function's URL in Vault: docs/supabase.md)")
    p.add_argument("--dry-run", action="store_true", help="list the files, write nothing")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print one JSON document on stdout and nothing else")


def run_init(a: argparse.Namespace) -> int:
    supabase = bool(getattr(a, "supabase", False)) and not a.plain
    if a.db_url or a.remote is not None:
        raise Exit(EXIT_USAGE, "init connects to no database: it takes no --db-url or --remote")
    role = a.role if a.role is not None else ("service_role" if supabase else None)
    try:
        project = init.Project(Path(a.dir), supabase=supabase, layers=init.parse_layers(a.layers),
                               role=role, cron=not a.no_cron, supervise=a.supervise)
        doc = project.run(a.dry_run)
    except init.InitError as e:
        raise Exit(e.code, e.message, None, **e.extra) from None
    print(json.dumps(doc, indent=2) if a.json else init.render(doc))
    return EXIT_OK


def _normalize_remote(argv: Sequence[str]) -> list[str]:
    # A bare --remote means the linked project; it must not swallow the next word.
    return [f"--remote={LINKED}" if a == "--remote" else a for a in argv]


@dataclass(frozen=True)
class Layer:
    """An optional layer a database has: its release (as the database records it, from 0.3.0
    on; before, the release whose fingerprint its schema has; None: none, so changed by hand),
    what differs from the database's record of it, its schema's fingerprint and the Sqitch
    registries that track the layer's own project there."""

    name: str
    fingerprint: str
    release: str | None
    sqitch: str | None
    drift: str | None = None

    @property
    def drifted(self) -> bool:
        return self.release is None or self.drift is not None


@dataclass(frozen=True)
class Installed:
    """What a database has: a schema pgfence or not, what its pgfence.version() says, whether
    its schema is exactly that release's (None: this package records no fingerprint for it),
    and the Sqitch registries that track pgfence there (None: none does)."""

    schema: bool
    version: str | None
    fingerprint: str | None = None
    released: str | None = None           # the fingerprint recorded for `version`
    sqitch: str | None = None
    drift: str | None = None              # what differs from the database's own record (0.3.0 on)
    layers: tuple[Layer, ...] = ()
    health: bool = False                  # pgfence.health() exists (0.2.0 on)
    cron: bool = False                    # pg_cron's cron.job exists

    @property
    def drifted(self) -> bool:
        """The schema differs from its release as installed (the database's record, from
        0.3.0 on) or as released (changed by hand, or an interrupted path): never "up to
        date", and nothing upgrades over it."""
        return self.drift is not None or (self.released is not None
                                          and self.fingerprint != self.released)


class Cli:
    files = Files()

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.json = bool(args.json)
        # The transport resolves the target, once; the commands pgfence prints for later name
        # it the same way, never with a URL or a password (transport.describe).
        if args.db_url:
            if args.remote is not None:
                raise Exit(EXIT_USAGE, "--remote goes with --supabase, not --db-url")
            self.transport: Direct | Supabase = Direct(args.db_url)
            self.target_args = self.transport.command_args
        elif args.supabase:
            self.transport = Supabase(args.supabase_bin, args.remote, progress=self.progress)
            binary = ("" if args.supabase_bin == "supabase"
                      else f" --supabase-bin {shlex.quote(args.supabase_bin)}")
            self.target_args = self.transport.command_args + binary
        else:
            raise Exit(EXIT_USAGE, "no target: give --db-url URL or --supabase [--remote[=REF|URL]]"
                                   " (pgfence never picks a database by itself)")

    # -- talking to the database --------------------------------------------------------
    # Every query names its columns: the Supabase CLI returns JSON objects with sorted keys.
    def read(self, query: str, columns: list[str]) -> Rows:
        return ordered(self.transport.query(query, read_only=True), columns)

    def write(self, query: str, columns: list[str]) -> Rows:
        if isinstance(self.transport, Supabase):
            rows = self.transport.query(query, read_only=False, confirmed=True)
        else:
            rows = self.transport.query(query, read_only=False)
        return ordered(rows, columns)

    def confirm(self, given: str | None) -> None:
        target = self.transport.target
        self.say(f"target: {self.transport.shown}")
        if given is not None:
            if given != target:
                raise Exit(EXIT_UNCONFIRMED,
                           f"--confirm {given!r} does not match the target {target!r}")
            return
        if not sys.stdin.isatty():
            raise Exit(EXIT_UNCONFIRMED, f"this changes {target}: confirm with --confirm {target} "
                                         "(no terminal to ask on)")
        sys.stderr.write(f"This changes {target}. Type the target name to confirm: ")
        sys.stderr.flush()
        if sys.stdin.readline().strip() != target:
            raise Exit(EXIT_UNCONFIRMED, "not confirmed: nothing was changed")

    def say(self, text: str) -> None:
        """Progress for people: stderr, and never in --json mode."""
        if not self.json:
            print(shown(text, lines=True), file=sys.stderr)

    def terminal(self) -> bool:
        """Whether progress lines go out: to a terminal, and never in --json mode."""
        return not self.json and sys.stderr.isatty()

    @contextmanager
    def progress(self) -> Iterator[None]:
        """Around each Supabase CLI call (seconds each): a line on the terminal that counts
        the seconds, erased when the call returns."""
        if not self.terminal():
            yield
            return
        done = threading.Event()

        def tick() -> None:
            started = time.monotonic()
            while True:
                sys.stderr.write(f"\r{ERASE}pgfence: waiting for the Supabase CLI "
                                 f"({time.monotonic() - started:.0f} s)")
                sys.stderr.flush()
                if done.wait(1.0):
                    break
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            sys.stderr.write(f"\r{ERASE}")
            sys.stderr.flush()

    # -- commands -----------------------------------------------------------------------
    def read_sets(self, queries: dict[str, tuple[str, list[str]]]) -> dict[str, Rows]:
        """Several queries' rows in one read: through the Supabase CLI each call costs over a
        second. Each set travels as JSON text (json_agg over the query, in its order)."""
        columns = ", ".join(f"(select coalesce(pg_catalog.json_agg(q), '[]')::text from ({sql}) q)"
                            f" as {name}" for name, (sql, _) in queries.items())
        (row,) = self.read(f"select {columns}", list(queries))
        return {name: ordered(json.loads(row[name]), cols)
                for name, (_, cols) in queries.items()}

    def status(self) -> dict[str, Any]:
        # Protections that stopped protecting (pgfence.protected_tables) and the counters
        # (pgfence.counters) exist from release 0.2.0 on: asked for once the first read says so.
        first = self.read_sets({
            "resources": (
                f"select resource, enabled, owner, generation, {seconds('time_left')}, "
                "stale, draining_leases, pending_invocations, claimed_tasks, "
                "open_update::text as open_update from pgfence.resource_status "
                "order by resource", RESOURCE_COLUMNS),
            "present": (
                "select pg_catalog.to_regclass('pgfence.protected_tables') is not null "
                "as problems, pg_catalog.to_regclass('pgfence.counters') is not null as counters, "
                "pg_catalog.to_regprocedure('pgfence.ref(uuid)') is not null as ref",
                ["problems", "counters", "ref"])})
        present = first["present"][0]
        # The token: the operator's way back to a window it lost (errors name it by its ref,
        # from release 0.2.0 on).
        ref = "pgfence.ref(token)" if present["ref"] else "null::text"
        later: dict[str, tuple[str, list[str]]] = {"windows": (
            f"select token::text as token, {ref} as ref, array_to_string(resources, ' ') "
            "as resources, prepared_at::text as prepared_at from pgfence.open_updates "
            "order by prepared_at", ["token", "ref", "resources", "prepared_at"])}
        if present["problems"]:
            later["problems"] = (
                "select table_name, array_to_string(resources, ' ') as resources, mode, problem "
                "from pgfence.protected_tables where not healthy order by table_name",
                ["table_name", "resources", "mode", "problem"])
        if present["counters"]:
            later["counters"] = (
                f"select resource, generation, lease_state, {seconds('lease_age')}, takeovers, "
                "stale_results, unfenced_writes, array_to_string(queues, ' ') as queues, "
                f"queue_depth, {seconds('oldest_ready_age')} from pgfence.counters "
                "order by resource", COUNTER_COLUMNS)
        second = self.read_sets(later)
        return {"target": self.transport.target, "resources": first["resources"],
                "open_updates": second["windows"],
                "protection_problems": second.get("problems", []),
                "counters": second.get("counters", [])}

    def doctor(self, requeue_elsewhere: bool) -> tuple[dict[str, Any], int]:
        """pgfence.health(), read-only, and the installed releases against the package: exit 1
        when any check fails, or when the database has no pgfence.health() (no pgfence, or a
        release older than 0.2.0).

        Judged here, not in SQL: "requeue job scheduled" asks pg_cron, which plain PostgreSQL
        does not have. The operator who schedules pgfence.requeue_expired() another way says
        so (--requeue-elsewhere: the check passes); without pg_cron and without that, it is a
        warning (exit 0), not a failure. With pg_cron and no job it still fails. And one row
        per release installed, pgfence's and each layer's: a warning when the package has a
        newer one, a failure for a layer whose schema is no release (changed by hand)."""
        has = self.installed()
        if not has.health:
            raise Exit(EXIT_REFUSED, f"{self.transport.target} has no pgfence.health(): pgfence "
                       "is not installed, or older than 0.2.0 (pgfence version)")
        checks = self.read('select h."check", h.ok, h.detail from pgfence.health() h',
                           ["check", "ok", "detail"])
        for c in checks:
            c["status"] = "ok" if c["ok"] is True else "failed"
            if c["check"] != REQUEUE_CHECK or c["ok"] is True:
                continue
            if requeue_elsewhere:
                c.update(status="ok", detail="pgfence.requeue_expired() runs on a schedule "
                         "other than pg_cron's (said with --requeue-elsewhere)")
            elif not has.cron:
                c["status"] = "warning"
                c["detail"] = ("pg_cron is not installed: if nothing else runs "
                               "pgfence.requeue_expired(), tasks of workers that died stay "
                               "claimed; schedule it (docs/operations.md#recovering-tasks) and "
                               "say so with doctor --requeue-elsewhere")
        checks += self.release_checks(has)
        checks = [{k: c[k] for k in ("check", "status", "detail")} | {"ok": c["status"] == "ok"}
                  for c in checks]
        failed = sum(c["status"] == "failed" for c in checks)
        return ({"target": self.transport.target, "ok": not failed,
                 "warnings": sum(c["status"] == "warning" for c in checks), "checks": checks},
                EXIT_REFUSED if failed else EXIT_OK)

    def release_checks(self, has: Installed) -> Rows:
        """pgfence's release and each installed layer's against this package's newest."""
        newest = self.files.newest()
        upgrade = self.command("upgrade", "--confirm", self.transport.target)
        v = str(has.version)
        rows = [{"check": "pgfence release", "ok": None, **(
            {"status": "ok", "detail": f"pgfence {v}, this package's newest"} if v == newest
            else {"status": "warning", "detail": f"pgfence {v}; this package has {newest}"
                  + (f": {upgrade}" if VERSION.fullmatch(v) and key(v) < key(newest)
                     else "")})}]
        for x in has.layers:
            doc = self.layer_doc(x, has.version, newest)
            rows.append({"check": f"{x.name} layer release", "ok": None, **{
                "up_to_date": {"status": "ok", "detail": f"{x.name} layer {x.release}"},
                "upgrade_available": {"status": "warning", "detail": (
                    f"{x.name} layer {x.release}; {doc['available']} available "
                    f"({', '.join(doc['upgrade_files'])}): {upgrade}")},
                "no_upgrade_path": {"status": "failed", "detail": (
                    f"{x.name} layer {x.release}, left behind pgfence {v}: its upgrade files run "
                    "only on the pgfence release they come with (docs/upgrading.md)")},
                "drifted": {"status": "failed", "detail": (
                    f"schema pgfence_{x.name} is no release of the layer that this package "
                    f"records (fingerprint {x.fingerprint}): changed by hand? "
                    "(docs/upgrading.md)") if x.release is None else (
                    f"{x.name} layer {x.release}, changed by hand since: {x.drift}")}
                }[doc["state"]]})
        return rows

    def update_status(self, token: uuid.UUID) -> Rows:
        return self.read(
            "select resource, saved_enabled, enabled, active_owner, draining_leases, "
            "in_flight_tasks, pending_invocations, verdict, "
            "last_heartbeat::text as last_heartbeat, "
            # every layer's work by kind, the unconverted writers seen since the window opened,
            # and what a layer sees of the workers (pgflow's, converted or not)
            "in_flight, unfenced_writes, workers "
            f"from pgfence.update_status({sql.uuid_literal(token)})", UPDATE_STATUS_COLUMNS)

    def wait(self, token: uuid.UUID, timeout: float | None) -> dict[str, Any]:
        """update_status until every resource is drained (the doc), or Exit 5 at the timeout.
        A window finished meanwhile is refused (exit 1): nothing is left to wait for. Only the
        operator's patience is timed here: nothing about the window depends on it."""
        started = time.monotonic()
        while True:
            rows = self.update_status(token)
            waited = round(time.monotonic() - started, 1)
            doc: dict[str, Any] = {"target": self.transport.target, "token": str(token),
                                   "status": rows, "waited_seconds": waited}
            verdicts = [r["verdict"] for r in rows]
            if all(v == "drained" for v in verdicts):
                self.progress_line(None)
                return doc
            if "finished" in verdicts:
                self.progress_line(None)
                raise Exit(EXIT_REFUSED, f"update {token} is finished: there is nothing to wait "
                           "for", **doc)
            pending = ", ".join(f"{r['resource']} {r['verdict']}" for r in rows
                                if r["verdict"] != "drained")
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0:
                self.progress_line(None)
                raise Exit(EXIT_GAVE_UP, f"gave up waiting after {waited:.0f} s (--timeout): "
                           f"not drained: {pending}. The window stays open; look again with "
                           f"{self.command('workers', 'update-status', str(token), '--wait')}",
                           **doc)
            self.progress_line(f"waiting for update {token} ({waited:.0f} s): "
                               f"{sum(v == 'drained' for v in verdicts)} of {len(rows)} "
                               f"drained; {pending}")
            time.sleep(POLL_SECONDS if left is None else max(0.0, min(POLL_SECONDS, left)))

    def progress_line(self, text: str | None) -> None:
        """One line that the next one replaces, on a terminal only; None erases it."""
        if self.terminal():
            sys.stderr.write(f"\r{ERASE}" + ("" if text is None else shown(text)))
            sys.stderr.flush()

    def set_enabled(self, resource: str, enabled: bool) -> dict[str, Any]:
        (row,) = self.write(f"select pgfence.set_enabled({sql.literal(resource)}, "
                            f"{'true' if enabled else 'false'}) as previous", ["previous"])
        return {"target": self.transport.target, "resource": resource, "enabled": enabled,
                "previous": row["previous"]}

    def deprecate(self, resource: str) -> dict[str, Any]:
        # deprecate returns the drained lease's id, a capability: shown by its ref only.
        (row,) = self.write(f"select pgfence.ref(d.id) as lease_ref from (select "
                            f"pgfence.deprecate({sql.literal(resource)}) as id) d",
                            ["lease_ref"])
        return {"target": self.transport.target, "resource": resource,
                "drained": row["lease_ref"] is not None, "lease_ref": row["lease_ref"]}

    def prune(self, older_than: float | None) -> dict[str, Any]:
        bound = "" if older_than is None else sql.interval(older_than)
        rows = self.write(f"select what, rows from pgfence.prune({bound})", ["what", "rows"])
        return {"target": self.transport.target, "older_than_seconds": older_than,
                "removed": rows}

    def prepare(self, resources: list[str], request_id: uuid.UUID) -> dict[str, Any]:
        query = (f"select pgfence.prepare_update({sql.text_array(resources)}, "
                 f"{sql.uuid_literal(request_id)})::text as token")
        retry = (f"pgfence {self.target_args} workers prepare-update {' '.join(resources)} "
                 f"--request-id {request_id} --confirm {self.transport.target}")
        token = None
        for attempt in range(1, PREPARE_ATTEMPTS + 1):
            try:
                token = self.write(query, ["token"])[0]["token"]
                break
            except TransportFailure as e:
                # The window may or may not have opened: the same request id finds out.
                self.say(f"attempt {attempt} failed: {e}; retrying with the same request id")
                if attempt == PREPARE_ATTEMPTS:
                    raise Exit(EXIT_TRANSPORT, f"{e}. It is unknown whether the window opened; "
                               f"run the same request again to find out: {retry}",
                               request_id=str(request_id), retry=retry) from None
        assert token is not None
        finish = (f"pgfence {self.target_args} workers finish-update {token} "
                  f"--confirm {self.transport.target}")
        try:
            rows = self.update_status(uuid.UUID(token))
        except (TransportFailure, Refused) as e:
            raise Exit(EXIT_TRANSPORT, f"{e}. Update {token} is open and its resources stay "
                       f"paused until you run: {finish}", token=token, finish=finish) from None
        if any(r["verdict"] == "finished" for r in rows):
            raise Exit(EXIT_REFUSED, f"request id {request_id} belongs to update {token}, which "
                       "is already finished: nothing was paused. Use a new request id.",
                       token=token)
        return {"target": self.transport.target, "request_id": str(request_id), "token": token,
                "status": rows, "finish": finish}

    def finish(self, token: uuid.UUID) -> tuple[dict[str, Any], int]:
        rows = self.write(f"select resource, enabled, outcome from "
                          f"pgfence.finish_update({sql.uuid_literal(token)})",
                          ["resource", "enabled", "outcome"])
        conflicts = [r["resource"] for r in rows if r["outcome"] == "conflict"]
        return ({"target": self.transport.target, "token": str(token), "results": rows},
                EXIT_REFUSED if conflicts else EXIT_OK)

    def installed(self) -> Installed:
        """Read-only. A database without schema pgfence has no pgfence; every release from
        0.1.0 on has pgfence.version(). The one place that judges what a database holds:
        version, install, upgrade and doctor all read it from here. Two reads at most, as
        each costs a Supabase CLI call: what the catalogs hold, then, only where
        pgfence.version() exists (a query naming it fails to parse elsewhere), the version, the
        schema's fingerprint and drift, and each installed layer's release, drift and Sqitch
        registry. From 0.3.0 on the database records the releases (pgfence.seal): drift is
        named against that record. A layer that records no release (one installed before
        0.3.0) is told by its fingerprint (Files.layer_release)."""
        layers = self.known_layers()
        found = self.read(
            f"select ({strip(self.files.query('sqitch_registry.sql'))}) as registry, "
            "to_regnamespace('pgfence') is not null as schema, "
            "to_regprocedure('pgfence.version()') is not null as versioned, "
            "to_regprocedure('pgfence.schema_drift(name)') is not null as recorded, "
            "to_regprocedure('pgfence.health()') is not null as health, "
            "to_regclass('cron.job') is not null as cron"
            + "".join(f", to_regnamespace('pgfence_{x}') is not null as layer_{x}"
                      for x in layers),
            ["registry", "schema", "versioned", "recorded", "health", "cron",
             *(f"layer_{x}" for x in layers)])[0]
        sqitch_registry = None if found["registry"] is None else str(found["registry"])
        if not found["versioned"]:
            return Installed(bool(found["schema"]), None, sqitch=sqitch_registry,
                             cron=bool(found["cron"]))
        present = [x for x in layers if found[f"layer_{x}"]]

        def drift(schema: str) -> str:
            return (f"(select string_agg(d.object || ' ' || d.how, '; ' order by d.object) "
                    f"from pgfence.schema_drift('{schema}') d)")

        if found["recorded"]:
            core = ("pgfence.schema_fingerprint('pgfence') as fingerprint, "
                    f"{drift('pgfence')} as drift")
            recorded = "".join(f", pgfence.installed_release('pgfence_{x}') as rel_{x}, "
                               f"{drift(f'pgfence_{x}')} as drift_{x}" for x in present)
        else:
            core = (f"({strip(self.files.query('fingerprint.sql'))}) as fingerprint, "
                    "null::text as drift")
            recorded = "".join(f", null::text as rel_{x}, null::text as drift_{x}"
                               for x in present)
        row = self.read(
            f"select pgfence.version() as version, {core}{recorded}"
            + "".join(f", ({strip(self.files.query('fingerprint.sql', f'pgfence_{x}'))}) as "
                      f"fp_{x}, ({strip(self.files.query('sqitch_registry.sql', f'pgfence_{x}'))})"
                      f" as reg_{x}" for x in present),
            ["version", "fingerprint", "drift",
             *(f"{k}_{x}" for x in present for k in ("rel", "drift", "fp", "reg"))])[0]
        v = None if row["version"] is None else str(row["version"])
        released = self.files.fingerprints().get(v) if v is not None else None
        fingerprint = None if released is None else str(row["fingerprint"])

        def layer(x: str) -> Layer:
            text = {k: None if row[f"{k}_{x}"] is None else str(row[f"{k}_{x}"])
                    for k in ("rel", "drift", "fp", "reg")}
            if text["rel"] is not None:          # sealed: the database's own record
                return Layer(x, str(text["fp"]), text["rel"], text["reg"], text["drift"])
            return Layer(x, str(text["fp"]), self.files.layer_release(x, str(text["fp"])),
                         text["reg"])

        return Installed(True, v, fingerprint, released, sqitch_registry,
                         None if row["drift"] is None else str(row["drift"]),
                         tuple(layer(x) for x in present), bool(found["health"]),
                         bool(found["cron"]))

    def known_layers(self) -> list[str]:
        """The layers this package carries, in the order they install (pgmq before pgflow)."""
        order = list(init.LAYERS)
        return sorted(self.files.layers(),
                      key=lambda x: (order.index(x) if x in order else len(order), x))

    def layer_chain(self, layer: Layer, to: str) -> list[Upgrade]:
        assert layer.release is not None
        return self.files.layer_chain(layer.name, layer.release, to)

    def stranded(self, layer: Layer, core: str, to: str) -> Upgrade | None:
        """The first of the layer's upgrade files that cannot run on the way from pgfence
        ``core`` to ``to``: a layer's file to B runs only while pgfence is at B, so a layer left
        behind a pgfence that has moved past B (upgraded alone, more than once) is stranded.
        None when every file can run."""
        core_path = {core, *(u.target for u in self.files.chain(core, to) or [])}
        return next((u for u in self.layer_chain(layer, to) if u.target not in core_path), None)

    def installed_version(self) -> str | None:
        """pgfence.version() after an install or upgrade committed: one read."""
        v = self.read("select pgfence.version() as version", ["version"])[0]["version"]
        return None if v is None else str(v)

    def sqitch_command(self, has: Installed, release: str) -> str:
        # Sqitch's plan names every release (@vX): any clone of release X or later deploys X,
        # whether or not it has git tags.
        return (f'sqitch deploy --to @v{release} "db:$DATABASE_URL"'
                + ("" if has.sqitch == "sqitch" else f" --registry {has.sqitch}")
                + f" in a clone of pgfence whose sqitch.plan has @v{release} (this release's "
                "or a later one; no git tag needed)")

    def refuse_other_paths(self, has: Installed, what: str, release: str) -> None:
        """One install path per database: where Sqitch deploys pgfence, only Sqitch changes it
        (the files refuse too: this says so before asking for confirmation)."""
        if has.sqitch is not None:
            raise Exit(EXIT_REFUSED, f"Sqitch deploys pgfence on {self.transport.target} "
                       f"(registry schema {has.sqitch}): {what} it with Sqitch, "
                       f"{self.sqitch_command(has, release)}; nothing was changed",
                       installed=has.version, sqitch_registry=has.sqitch)
        if has.drifted:
            raise Exit(EXIT_REFUSED, f"the pgfence schema on {self.transport.target} differs "
                       f"from release {has.version} as released (changed by hand?): "
                       f"{drift_detail(has)}; restore the released definitions first "
                       "(docs/upgrading.md); nothing was changed",
                       installed=has.version, fingerprint=has.fingerprint)
        for layer in has.layers:
            if layer.drifted:
                what_differs = (f"it differs from release {layer.release} as installed: "
                                f"{layer.drift}" if layer.drift else
                                f"it is no release of the {layer.name} layer that this package "
                                f"records: fingerprint {layer.fingerprint}")
                raise Exit(EXIT_REFUSED, f"the pgfence_{layer.name} schema on "
                           f"{self.transport.target} was changed by hand?: {what_differs}; "
                           "restore the released definitions first (docs/upgrading.md); "
                           "nothing was changed", layer=layer.name,
                           fingerprint=layer.fingerprint)
            if layer.sqitch is not None and self.layer_chain(layer, release):
                raise Exit(EXIT_REFUSED, f"Sqitch deploys the {layer.name} layer on "
                           f"{self.transport.target} (registry schema {layer.sqitch}): "
                           f"{what} it with Sqitch, `cd layers/{layer.name} && sqitch deploy "
                           f'--to @v{release} "db:$DATABASE_URL"` in a clone of pgfence, after '
                           "pgfence itself; nothing was changed", layer=layer.name,
                           sqitch_registry=layer.sqitch)

    def command(self, *words: str) -> str:
        return " ".join(["pgfence", self.target_args, *words])

    def upgrade_steps(self, has: Installed, to: str) -> list[Upgrade] | None:
        """Every file an upgrade to ``to`` runs, in order: pgfence's chain and each installed
        layer's (a layer's file to release B needs pgfence B: each release's core file first,
        then its layers', pgmq before pgflow). None when no chain of pgfence's files leads
        there, or when an installed layer's files cannot run on the way (stranded). A layer
        whose release is unknown (changed by hand) contributes nothing: it is refused before
        this is used (refuse_other_paths)."""
        assert has.version is not None
        core = self.files.chain(has.version, to)
        if core is None:
            return None
        steps = [(key(u.target), 0, u) for u in core]
        for i, layer in enumerate(has.layers, 1):
            if layer.release is not None:
                if self.stranded(layer, has.version, to) is not None:
                    return None
                steps += [(key(u.target), i, u) for u in self.layer_chain(layer, to)]
        return [u for *_, u in sorted(steps, key=lambda s: (s[0], s[1]))]

    def version(self) -> dict[str, Any]:
        newest = self.files.newest()
        has = self.installed()
        doc: dict[str, Any] = {"target": self.transport.target, "installed": has.version,
                               "package": newest, "state": "", "upgrade_files": [],
                               "sqitch_registry": has.sqitch, "fingerprint": has.fingerprint,
                               "release_fingerprint": has.released, "drift": has.drift,
                               "layers": [self.layer_doc(x, has.version, newest)
                                          for x in has.layers]}
        layer_states = {x["state"] for x in doc["layers"]}
        if not has.schema:
            doc["state"] = "not_installed"
        elif has.version is None or not VERSION.fullmatch(has.version):
            doc["state"] = "unknown"
        elif has.drifted or "drifted" in layer_states:
            doc["state"] = "drifted"
        elif key(has.version) > key(newest):
            doc["state"] = "newer_than_package"
        else:
            steps = self.upgrade_steps(has, newest)
            doc["state"] = ("no_upgrade_path" if steps is None else
                            "upgrade_available" if steps else "up_to_date")
            doc["upgrade_files"] = [u.name for u in steps or []]
        return doc

    def layer_doc(self, layer: Layer, core: str | None, newest: str) -> dict[str, Any]:
        """One installed layer against the package: up_to_date, upgrade_available (its files),
        no_upgrade_path (stranded behind pgfence ``core``), or drifted (its schema is no
        release this package records, or differs from the database's record of it)."""
        chain = [] if layer.release is None else self.layer_chain(layer, newest)
        files = [u.name for u in chain]
        stuck = (None if layer.release is None or core is None or not VERSION.fullmatch(core)
                 else self.stranded(layer, core, newest))
        state = ("drifted" if layer.drifted else "no_upgrade_path" if stuck is not None else
                 "upgrade_available" if files else "up_to_date")
        # The layer's newest release: the last file's (a release that does not change a layer
        # ships none, so it may be older than pgfence's newest).
        return {"layer": layer.name, "installed": layer.release, "state": state,
                "available": chain[-1].target if chain else layer.release,
                "upgrade_files": files, "sqitch_registry": layer.sqitch,
                "fingerprint": layer.fingerprint, "drift": layer.drift}

    def render_version(self, d: dict[str, Any]) -> str:
        confirm = f"--confirm {self.transport.target}"
        installed = {
            "not_installed": "not installed (no schema pgfence)",
            "unknown": ("unknown: schema pgfence exists, but pgfence.version() "
                        + ("is missing" if d["installed"] is None
                           else f"says {d['installed']!r}")
                        + " (older than 0.1.0, or not pgfence's)"),
        }.get(d["state"], d["installed"])
        if d["drift"] or (d["release_fingerprint"] is not None
                          and d["fingerprint"] != d["release_fingerprint"]):
            installed = (f"{d['installed']}, changed by hand: the schema differs from release "
                         f"{d['installed']} as released ("
                         + (d["drift"] or f"fingerprint {d['fingerprint']}, the release has "
                                          f"{d['release_fingerprint']}") + ")")
        lines = [f"target:    {d['target']}", f"installed: {installed}"]
        for x in d["layers"]:
            said = {"up_to_date": f"{x['installed']}",
                    "upgrade_available": f"{x['installed']}; {x['available']} available",
                    "no_upgrade_path": (f"{x['installed']}, left behind pgfence "
                                        f"{d['installed']}: its upgrade files run only on the "
                                        "pgfence release they come with, which this database "
                                        "has passed"),
                    "drifted": (f"{x['installed']}, changed by hand: {x['drift']}"
                                if x["drift"] else
                                "changed by hand: its schema is no release this package "
                                f"records (fingerprint {x['fingerprint']})")}[x["state"]]
            if x["sqitch_registry"] is not None:
                said += (f"; deployed by Sqitch (registry schema {x['sqitch_registry']}): "
                         f"upgrade it with `cd layers/{x['layer']} && sqitch deploy`")
            lines.append(f"  {x['layer']} layer: {said}")
        lines.append(f"package:   {d['package']} (the newest release this package installs)")
        sqitch = d["sqitch_registry"]
        if sqitch is not None:
            lines.append(f"sqitch:    deployed by Sqitch (registry schema {sqitch}): install, "
                         "upgrade and revert it with Sqitch only")
        has = Installed(True, d["installed"], sqitch=sqitch)
        upgrade = (self.sqitch_command(has, d["package"]) if sqitch is not None
                   else self.command("upgrade", confirm))
        lines.append({
            "not_installed": (f"to install: {self.command('install', confirm)}" if sqitch is None
                              else f"to install: {self.sqitch_command(has, d['package'])}"),
            "up_to_date": "up to date" + (", and every layer" if d["layers"] else ""),
            "drifted": ("NOT up to date: restore the released definitions (a fresh install of "
                        "the release shows them) before anything else; upgrades refuse a "
                        "schema changed by hand (docs/upgrading.md)"),
            "upgrade_available": (f"upgrade available ({', '.join(d['upgrade_files'])}): "
                                  f"{upgrade}"),
            "no_upgrade_path": (f"this package has no upgrade files from {d['installed']}"
                                if not any(x["state"] == "no_upgrade_path" for x in d["layers"])
                                else "no upgrade path: a layer is left behind (above)"),
            "newer_than_package": ("the database is newer than this package: upgrade the "
                                   "pgfence package before you run its commands here"),
            "unknown": "pgfence cannot install or upgrade over this schema",
        }[d["state"]])
        return "\n".join(lines)

    def install(self, release: str, given: str | None) -> dict[str, Any]:
        """The newest release's full install, or an older one's (--to): every release's file is
        in the package, so none needs a checkout of its own."""
        newest = self.files.newest()
        script = self.files.install() if release == newest else self.files.release(release)
        has = self.installed()
        self.refuse_other_paths(has, "install", release)
        if has.schema:
            what = (f"pgfence {has.version} is" if has.version
                    else "a schema pgfence (without pgfence.version()) is")
            hint = (f" To move to {newest}: {self.command('upgrade')}"
                    if has.version and has.version != newest else "")
            raise Exit(EXIT_REFUSED, f"{what} already installed on {self.transport.target}: "
                       f"nothing was changed.{hint}", installed=has.version)
        name = (self.files.install_file().name if release == newest
                else f"releases/pgfence--{release}.sql")
        self.say(f"install: pgfence {release} ({name}, one transaction)")
        self.confirm(given)
        self.run_scripts([script, self.expect_version(release)], "install")
        return {"target": self.transport.target, "installed": self.installed_version(),
                "previous": None, "changed": True}

    def upgrade(self, to: str, given: str | None) -> dict[str, Any]:
        newest = self.files.newest()
        has = self.installed()
        target = self.transport.target
        if not has.schema:
            raise Exit(EXIT_REFUSED, f"pgfence is not installed on {target}: nothing to "
                       f"upgrade; run install: {self.command('install')}")
        if has.version is None or not VERSION.fullmatch(has.version):
            said = "is missing" if has.version is None else f"says {has.version!r}"
            raise Exit(EXIT_REFUSED, f"the schema pgfence on {target} is not a pgfence release "
                       f"this package can upgrade (pgfence.version() {said}): nothing was "
                       "changed", installed=has.version)
        v = has.version
        self.refuse_other_paths(has, "upgrade", to)
        if key(v) > key(newest):
            raise Exit(EXIT_REFUSED, f"{target} has pgfence {v}, newer than {newest}, the newest "
                       "release this package knows: install a newer pgfence package "
                       "(scripts/build in a clone that has it); nothing was changed",
                       installed=v, package=newest)
        if key(v) > key(to):
            raise Exit(EXIT_REFUSED, f"{target} has pgfence {v}, newer than {to}: pgfence "
                       "never downgrades; nothing was changed", installed=v)
        steps = self.upgrade_steps(has, to)
        stuck = [(x, u) for x in has.layers if (u := self.stranded(x, v, to)) is not None]
        if stuck:
            x, u = stuck[0]
            raise Exit(EXIT_REFUSED, f"the {x.name} layer on {target} is at {x.release}, left "
                       f"behind pgfence {v}: its next upgrade file ({u.name}) runs only while "
                       f"pgfence is at {u.target}, which this database has passed; nothing was "
                       "changed (docs/upgrading.md, \"The layers\")", installed=v,
                       layer=x.name)
        if steps is None:
            raise Exit(EXIT_REFUSED, f"this package has no upgrade files from {v} to {to}: "
                       "nothing was changed", installed=v)
        names = [u.name for u in steps]
        layers = [{"layer": x.name, "previous": x.release, "installed": to}
                  for x in has.layers if self.layer_chain(x, to)]
        if not steps:
            return {"target": target, "installed": v, "previous": v, "upgrade_files": [],
                    "changed": False, "layers": []}
        self.say((f"upgrade: pgfence {v} -> {to}" if v != to else f"upgrade: pgfence {v}")
                 + "".join(f", {x['layer']} layer {x['previous']} -> {to}" for x in layers)
                 + f" ({', '.join(names)}, one transaction)")
        self.confirm(given)
        self.run_scripts([*(u.text() for u in steps), self.expect_version(to)], "upgrade")
        return {"target": target, "installed": self.installed_version(), "previous": v,
                "upgrade_files": names, "changed": True, "layers": layers}

    @staticmethod
    def expect_version(version: str) -> str:
        """The last statement of an install or upgrade: inside its transaction, the files must
        have left the release they are named for, or nothing commits."""
        return ("do $pgfence_expect$ begin if pgfence.version() is distinct from "
                f"{sql.literal(version)} then raise exception "
                "'pgfence.version() says % after the files for % ran', pgfence.version(), "
                f"{sql.literal(version)} using errcode = '55000'; end if; end $pgfence_expect$")

    def run_scripts(self, scripts: list[str], what: str) -> None:
        try:
            self.transport.run_script(scripts)
        except Refused as e:
            raise Exit(EXIT_REFUSED, f"the {what} failed and was rolled back, nothing was "
                       f"changed: {e}") from None
        except TransportFailure as e:
            raise Exit(EXIT_TRANSPORT, f"{e}. The {what} runs in one transaction: it committed "
                       f"entirely or not at all. To see which: {self.command('version')}") from None

    def run(self) -> int:
        try:
            return self.dispatch()
        except Refused as e:
            raise self.explain(e) from None

    def dispatch(self) -> int:
        a = self.args
        if a.command == "version":
            doc = self.version()
            self.emit(doc, self.render_version)
            return EXIT_REFUSED if doc["state"] == "drifted" else EXIT_OK
        if a.command == "install":
            doc = self.install(self.upgrade_target(a.to), a.confirm)
            return self.emit(doc, lambda d: f"pgfence {d['installed']} is installed on "
                             f"{d['target']}.")
        if a.command == "upgrade":
            doc = self.upgrade(self.upgrade_target(a.to), a.confirm)
            return self.emit(doc, lambda d: (
                f"pgfence {d['installed']} on {d['target']} is up to date: nothing to do."
                if not d["changed"] else
                f"pgfence on {d['target']}: "
                + (f"{d['previous']} -> {d['installed']}" if d["previous"] != d["installed"]
                   else f"{d['installed']} (unchanged)")
                + "".join(f", {x['layer']} layer {x['previous']} -> {x['installed']}"
                          for x in d["layers"])
                + f" ({', '.join(d['upgrade_files'])})."))
        if a.command == "status":
            return self.emit(self.status(), lambda d: table(d["resources"]) + "\n\nopen updates:\n"
                             + table(d["open_updates"])
                             + ("\n\ncounters:\n" + table(d["counters"]) if d["counters"] else "")
                             + ("\n\nprotections that stopped protecting:\n"
                                + table(d["protection_problems"]) if d["protection_problems"]
                                else ""))
        if a.command == "doctor":
            doc, code = self.doctor(a.requeue_elsewhere)
            self.emit(doc, render_doctor)
            return code
        if a.command == "prune":
            older_than = None if a.older_than is None else sql.seconds(a.older_than,
                                                                       "--older-than")
            self.confirm(a.confirm)
            return self.emit(self.prune(older_than), lambda d: table(d["removed"]))
        if a.action == "update-status":
            token = sql.token(a.token)
            if a.timeout is not None and not a.wait:
                raise Exit(EXIT_USAGE, "--timeout goes with --wait")
            timeout = None if a.timeout is None else sql.seconds(a.timeout, "--timeout")
            doc = (self.wait(token, timeout) if a.wait else
                   {"target": self.transport.target, "token": str(token),
                    "status": self.update_status(token)})
            return self.emit(doc, lambda d: table(d["status"]))
        if a.action == "prepare-update":
            resources = [sql.resource(r) for r in a.resources]
            request_id = sql.token(a.request_id, "request id") if a.request_id else uuid.uuid4()
            self.confirm(a.confirm)
            self.say(f"request id: {request_id} (rerun with --request-id {request_id} "
                     "if this is interrupted)")
            doc = self.prepare(resources, request_id)
            return self.emit(doc, lambda d: (
                f"update {d['token']} is open; its resources are paused.\n\n{table(d['status'])}"
                "\n\nwhen every verdict is drained (to wait for it: "
                f"{self.command('workers', 'update-status', d['token'], '--wait')}), deploy, "
                f"then run:\n  {d['finish']}"))
        if a.action == "finish-update":
            token = sql.token(a.token)
            self.confirm(a.confirm)
            doc, code = self.finish(token)
            self.emit(doc, lambda d: table(d["results"]))
            if code != EXIT_OK:
                self.say("conflict: enabled was changed inside the window and was left as it is; "
                         "decide with: " + self.command("workers", "set-enabled", "RESOURCE",
                                                        "true|false"))
            return code
        if a.action == "set-enabled":
            resource = sql.resource(a.resource)
            self.confirm(a.confirm)
            return self.emit(self.set_enabled(resource, a.enabled == "true"), lambda d: (
                f"{d['resource']}: enabled {str(d['enabled']).lower()} (it was "
                f"{str(d['previous']).lower()})"))
        if a.action == "deprecate":
            resource = sql.resource(a.resource)
            self.confirm(a.confirm)
            return self.emit(self.deprecate(resource), lambda d: (
                f"{d['resource']}: its lease (ref {d['lease_ref']}) is draining: it finishes "
                "what it holds and claims nothing; a successor may start now"
                if d["drained"] else f"{d['resource']} had no active lease: nothing to drain"))
        raise Exit(EXIT_USAGE, "unknown command")

    def finish_command(self, token: str) -> str:
        return self.command("workers", "finish-update", token, "--confirm",
                            self.transport.target)

    def explain(self, e: Refused) -> Exit:
        """A refusal as the operator can act on it, in the CLI's words: a missing role named
        with the grant that gives it; an update window named by its ref (errors never carry a
        token) resolved to its token and the command that finishes it. What the database said
        is kept; its hint, which names SQL functions, gives way to the CLI's."""
        a = self.args
        if e.sqlstate == "42501" or (e.sqlstate is None and "permission denied" in e.text):
            missing = self.missing_role(e)
            if missing is not None:
                return missing
        refs = sorted(set(re.findall(r"update ref ([0-9a-f]{12})", e.text)))
        if not refs:
            return Exit(EXIT_REFUSED, f"the database refused: {e}", e.sqlstate)
        windows = self.read("select token::text as token, pgfence.ref(token) as ref, "
                            "array_to_string(resources, ' ') as resources from "
                            "pgfence.open_updates where pgfence.ref(token) = any(array["
                            + ", ".join(sql.literal(r) for r in refs) + "])",
                            ["token", "ref", "resources"])
        said = [f"update ref {w['ref']} is the open window {w['token']} over {w['resources']}: "
                f"when its deploy is done, finish it with {self.finish_command(w['token'])}"
                for w in windows]
        if len(windows) < len(refs):
            given = f" ({a.token} is not one of them)" if getattr(a, "token", None) else ""
            said.append(f"`{self.command('status')}` lists the open windows with their "
                        f"tokens{given}")
        return Exit(EXIT_REFUSED, f"the database refused: {e.text}. " + "; ".join(said),
                    e.sqlstate, windows=windows)

    def missing_role(self, e: Refused) -> Exit | None:
        """After a permission failure: which pgfence role the connected role lacks, and who
        may grant it, asked of the database (the Supabase CLI passes on no SQLSTATE, so this
        answer is what tells a missing role there). None when the role has it: then the
        refusal is about something else and is reported as it came."""
        a = self.args
        if a.command in ("install", "upgrade"):
            return None             # the owner's work, not a pgfence role's
        needs = (["pgfence_operator"] if a.command == "prune" or getattr(a, "action", "") in
                 MUTATIONS else ["pgfence_monitor", "pgfence_operator"])
        try:
            rows = self.read(
                "select pg_catalog.quote_ident(current_user) as role, "
                "n.nspowner::regrole::text as owner, "
                "pg_catalog.pg_has_role(current_user, n.nspowner, 'usage') or exists (select "
                "from pg_catalog.pg_roles r where r.rolname = any(array["
                + ", ".join(sql.literal(r) for r in needs) + "]) and "
                "pg_catalog.pg_has_role(current_user, r.oid, 'usage')) as has "
                "from pg_catalog.pg_namespace n where n.nspname = 'pgfence'",
                ["role", "owner", "has"])
        except (Refused, TransportFailure):
            return None
        if not rows or rows[0]["has"]:
            return None
        role, owner = rows[0]["role"], rows[0]["owner"]
        return Exit(EXIT_REFUSED, f"permission denied: the role {role} may not do this, it "
                    f"needs {' or '.join(needs)} ({e.text}). As {owner} (the owner of schema "
                    f"pgfence) or another role that may grant it, run: grant {needs[0]} to "
                    f"{role};", "42501", role=role, needs=needs[0])

    def upgrade_target(self, to: str | None) -> str:
        """--to checked against this package's files, before any connection."""
        if to is None:
            return self.files.newest()
        known = self.files.known()
        if to not in known:
            raise Exit(EXIT_USAGE, f"--to {to!r}: this package knows pgfence releases "
                       f"{', '.join(known)}")
        return to

    def emit(self, doc: dict[str, Any], human: Any) -> int:
        print(json.dumps(doc, indent=2) if self.json else human(doc))
        return EXIT_OK


MUTATIONS = {"prepare-update", "finish-update", "set-enabled", "deprecate"}
REQUEUE_CHECK = "requeue job scheduled"     # pgfence.health()'s name for it
RESOURCE_COLUMNS = ["resource", "enabled", "owner", "generation", "time_left", "stale",
                    "draining_leases", "pending_invocations", "claimed_tasks", "open_update"]
COUNTER_COLUMNS = ["resource", "generation", "lease_state", "lease_age", "takeovers",
                   "stale_results", "unfenced_writes", "queues", "queue_depth", "oldest_ready_age"]
UPDATE_STATUS_COLUMNS = ["resource", "saved_enabled", "enabled", "active_owner", "draining_leases",
                         "in_flight_tasks", "pending_invocations", "verdict", "last_heartbeat",
                         "in_flight", "unfenced_writes", "workers"]


def strip(query: str) -> str:
    """A query file's one statement, without comments or the final semicolon, to nest."""
    lines = [ln for ln in query.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


def render_doctor(d: dict[str, Any]) -> str:
    checks = [{k: c[k] for k in ("check", "status", "detail")} for c in d["checks"]]
    failed = sum(c["status"] == "failed" for c in checks)
    warned = f", {d['warnings']} warning{'s' if d['warnings'] != 1 else ''}" if d["warnings"] \
        else ""
    return table(checks) + "\n\n" + (f"healthy{warned}" if d["ok"] else
                                      f"{failed} of {len(checks)} checks failed{warned}")


def seconds(column: str) -> str:
    """An interval column as seconds (JSON has no interval), to the millisecond."""
    return (f"pg_catalog.round(extract(epoch from {column})::numeric, 3)::float8 "
            f"as {column}")


def drift_detail(has: Installed) -> str:
    if has.drift is not None:
        return has.drift
    return f"schema fingerprint {has.fingerprint}, release {has.version} has {has.released}"


def ordered(rows: Rows, columns: list[str]) -> Rows:
    return [{c: row.get(c) for c in columns} for row in rows]


def shown(text: str, lines: bool = False) -> str:
    """Text from a database as the terminal gets it: every character that is not printable
    (controls, format characters such as bidi overrides, separators other than the space)
    escaped as Python writes it (\\x1b, \\u202e), and backslashes doubled, so that nothing
    in a table, trigger, resource or owner name can move the cursor, recolour or reorder the
    operator's screen, and an escape cannot be faked. Every string that reaches the terminal
    from a database goes through here (table, say, _fail); --json output is escaped by json.
    With ``lines``, a message's own line breaks are kept."""
    if lines:
        return "\n".join(shown(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() and c != "\\" else
                   "\\\\" if c == "\\" else
                   f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                   f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
                   for c in text)


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def table(rows: Rows) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    cells = [[shown(cell(r[c])) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in raw
    cli: Cli | None = None
    try:
        args = build_parser().parse_args(_normalize_remote(raw))
        if args.command == "init":
            return run_init(args)
        merge_late(args)
        cli = Cli(args)
        return cli.run()
    except SystemExit as e:            # --help, --version
        return int(e.code or 0)
    except Exit as e:
        error = e
    except sql.BadInput as e:
        error = Exit(EXIT_USAGE, str(e))
    except Refused as e:
        error = Exit(EXIT_REFUSED, f"the database refused: {e}", e.sqlstate)
    except TransportFailure as e:
        error = Exit(EXIT_TRANSPORT, str(e))
    except BrokenPackage as e:
        error = Exit(EXIT_USAGE, str(e))
    return _fail(error, as_json, None if cli is None else cli.transport.target)


def _fail(e: Exit, as_json: bool, target: str | None) -> int:
    """The one way an error leaves: one JSON document on stdout (--json), else one line on
    stderr after one "pgfence:" (and the usage line for a usage error)."""
    extra = dict(e.extra)
    usage = extra.pop("usage", None)
    if as_json:
        print(json.dumps({"error": e.message, "sqlstate": e.sqlstate, "target": target,
                          "exit_code": e.code, **extra}, indent=2))
    else:
        if usage:
            print(usage, file=sys.stderr)
        print(f"pgfence: {shown(e.message, lines=True)}", file=sys.stderr)
    return e.code


if __name__ == "__main__":
    sys.exit(main())

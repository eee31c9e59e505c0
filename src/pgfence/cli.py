"""pgfence: operator commands for update windows, over a direct connection or the Supabase CLI.

The protocol lives in SQL (pgfence.prepare_update, update_status, finish_update, and the
install and upgrade files this package carries); this is a thin caller: it resolves the
target, asks the operator to confirm it, calls the functions or runs the files in one
transaction, and renders what they return.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pgfence import init, sql
from pgfence.releases import VERSION, BrokenPackage, Files, key
from pgfence.transport import (
    LINKED,
    Direct,
    Refused,
    Rows,
    Supabase,
    TransportFailure,
)

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_TRANSPORT, EXIT_UNCONFIRMED = 0, 1, 2, 3, 4
PREPARE_ATTEMPTS = 3

EPILOG = """\
target (exactly one, never a default):
  --db-url URL                a PostgreSQL URL or conninfo string, reached with psycopg
  --supabase                  the local Supabase stack, through the installed `supabase` CLI
  --supabase --remote         the linked project (SUPABASE_PROJECT_ID, else supabase link's)
  --supabase --remote=REF|URL a project ref (a branch by its own ref) or a database URL
(init writes files and connects to nothing: it takes no target)

Output never shows a URL or a password, only the target (host:port/db, a project ref, or
local); the commands it prints for later say "$DATABASE_URL" where your URL goes.

Mutations (install, upgrade, prepare-update, finish-update) show the resolved target and need
the operator to confirm it: typed at the prompt, or --confirm TARGET. No environment variable
bypasses that. install and upgrade run their SQL in one transaction: all of it, or nothing.

exit codes:
  0  done (also: upgrade with nothing to do)
  1  the database refused (unknown token, overlap, conflict, not current; pgfence already
     installed, not installed, newer than this package, or an install/upgrade file failed);
     doctor: a check failed; init: a file in the way (not written by init, or changed since):
     nothing written
  2  usage or bad input (also: an upgrade --to a release this package does not know; init:
     no such DIR, no DIR/supabase, an unknown layer)
  3  transport or connection failure
  4  confirmation missing or wrong
"""


class Exit(Exception):
    def __init__(self, code: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise Exit(EXIT_USAGE, f"{self.prog}: {message}")


def build_parser() -> Parser:
    parser = Parser(prog="pgfence", description=__doc__.split("\n")[0] if __doc__ else None,
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--db-url", metavar="URL", help="PostgreSQL URL or conninfo string")
    target.add_argument("--supabase", action="store_true", help="use the Supabase CLI")
    parser.add_argument("--remote", metavar="REF|URL", nargs="?",
                        help="with --supabase: the linked project, or --remote=REF|URL")
    parser.add_argument("--supabase-bin", metavar="PATH", default="supabase",
                        help="the Supabase CLI to run (default: `supabase` on PATH)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document on stdout and nothing else")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=Parser)
    commands.add_parser("status", help="resources, owners and open windows (read-only)")
    commands.add_parser("doctor", help="pgfence.health(): every check of this installation "
                                       "(read-only; exit 1 when one fails)")
    commands.add_parser("version", help="the installed pgfence release and this package's "
                                        "(read-only)")
    install = commands.add_parser(
        "install", help="install the newest pgfence release into a database without it",
        description="Runs the package's sql/pgfence.sql in one transaction. A database that "
                    "already has a schema pgfence is left as it is (exit 1): use upgrade.")
    install.add_argument("--confirm", metavar="TARGET", help="the resolved target, to confirm")
    upgrade = commands.add_parser(
        "upgrade", help="upgrade pgfence to a newer release, keeping every lease and task",
        description="Runs the package's upgrade files (sql/upgrades/pgfence--A--B.sql) from the "
                    "installed release to the target release, all in one transaction. Nothing "
                    "to do when the database has the target release already (exit 0).")
    upgrade.add_argument("--to", metavar="VERSION",
                         help="the release to upgrade to (default: the newest this package has)")
    upgrade.add_argument("--confirm", metavar="TARGET", help="the resolved target, to confirm")
    workers = commands.add_parser("workers", help="update windows for deploying worker code")
    window = workers.add_subparsers(dest="action", metavar="ACTION", required=True,
                                    parser_class=Parser)
    prepare = window.add_parser(
        "prepare-update", help="pause resources: save enabled, disable, drain",
        description="Opens an update window. The request id makes a retry safe: the same "
                    "request id and resources return the same window, never re-saving state.")
    prepare.add_argument("resources", nargs="+", metavar="RESOURCE")
    prepare.add_argument("--request-id", metavar="UUID", help="default: a new one, printed")
    prepare.add_argument("--confirm", metavar="TARGET", help="the resolved target, to confirm")
    status = window.add_parser("update-status", help="what is still running (read-only)")
    status.add_argument("token")
    finish = window.add_parser("finish-update", help="restore exactly what prepare saved")
    finish.add_argument("token")
    finish.add_argument("--confirm", metavar="TARGET", help="the resolved target, to confirm")
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
                               role=role, cron=not a.no_cron)
        doc = project.run(a.dry_run)
    except init.InitError as e:
        raise Exit(e.code, e.message, **e.extra) from None
    print(json.dumps(doc, indent=2) if a.json else init.render(doc))
    return EXIT_OK


def _normalize_remote(argv: Sequence[str]) -> list[str]:
    # A bare --remote means the linked project; it must not swallow the next word.
    return [f"--remote={LINKED}" if a == "--remote" else a for a in argv]


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
            self.transport = Supabase(args.supabase_bin, args.remote)
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
                "select resource, enabled, owner, generation, time_left::text as time_left, "
                "stale, draining_leases, pending_invocations, claimed_tasks, "
                "open_update::text as open_update from pgfence.resource_status "
                "order by resource", RESOURCE_COLUMNS),
            "windows": (
                "select token::text as token, array_to_string(resources, ' ') as resources, "
                "prepared_at::text as prepared_at from pgfence.open_updates order by prepared_at",
                ["token", "resources", "prepared_at"]),
            "present": (
                "select pg_catalog.to_regclass('pgfence.protected_tables') is not null "
                "as problems, pg_catalog.to_regclass('pgfence.counters') is not null as counters",
                ["problems", "counters"])})
        present = first["present"][0]
        later: dict[str, tuple[str, list[str]]] = {}
        if present["problems"]:
            later["problems"] = (
                "select table_name, array_to_string(resources, ' ') as resources, mode, problem "
                "from pgfence.protected_tables where not healthy order by table_name",
                ["table_name", "resources", "mode", "problem"])
        if present["counters"]:
            later["counters"] = (
                "select resource, generation, lease_state, "
                "date_trunc('second', lease_age)::text as lease_age, takeovers, stale_results, "
                "unfenced_writes, array_to_string(queues, ' ') as queues, queue_depth, "
                "date_trunc('second', oldest_ready_age)::text as oldest_ready_age "
                "from pgfence.counters order by resource", COUNTER_COLUMNS)
        second = self.read_sets(later) if later else {}
        return {"target": self.transport.target, "resources": first["resources"],
                "open_updates": first["windows"], "protection_problems": second.get("problems", []),
                "counters": second.get("counters", [])}

    def doctor(self) -> tuple[dict[str, Any], int]:
        """pgfence.health(), read-only: exit 1 when any check fails, or when the database has
        no pgfence.health() (no pgfence, or a release older than 0.2.0)."""
        has = self.read("select pg_catalog.to_regprocedure('pgfence.health()') is not null "
                        "as present", ["present"])
        if not has or not has[0]["present"]:
            raise Exit(EXIT_REFUSED, f"{self.transport.target} has no pgfence.health(): pgfence "
                       "is not installed, or older than 0.2.0 (pgfence version)")
        checks = self.read('select h."check", h.ok, h.detail from pgfence.health() h',
                           ["check", "ok", "detail"])
        healthy = all(c["ok"] is True for c in checks)
        return ({"target": self.transport.target, "ok": healthy, "checks": checks},
                EXIT_OK if healthy else EXIT_REFUSED)

    def update_status(self, token: uuid.UUID) -> Rows:
        return self.read(
            "select resource, saved_enabled, enabled, active_owner, draining_leases, "
            "in_flight_tasks, pending_invocations, verdict, "
            "last_heartbeat::text as last_heartbeat, "
            # every layer's work by kind, and the unconverted writers seen since the window opened
            "in_flight::text as in_flight, unfenced_writes::text as unfenced_writes "
            f"from pgfence.update_status({sql.uuid_literal(token)})", UPDATE_STATUS_COLUMNS)

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
        version, install, upgrade (and doctor) all read it from here. Two reads at most, as
        each costs a Supabase CLI call: what the catalogs hold, then, only where
        pgfence.version() exists (a query naming it fails to parse elsewhere), the version and
        the schema's fingerprint."""
        found = self.read(f"select ({strip(self.files.query('sqitch_registry.sql'))}) "
                          "as registry, to_regnamespace('pgfence') is not null as schema, "
                          "to_regprocedure('pgfence.version()') is not null as versioned, "
                          "to_regprocedure('pgfence.schema_drift(name)') is not null as recorded",
                          ["registry", "schema", "versioned", "recorded"])[0]
        sqitch_registry = None if found["registry"] is None else str(found["registry"])
        if not found["versioned"]:
            return Installed(bool(found["schema"]), None, sqitch=sqitch_registry)
        if found["recorded"]:
            # From 0.3.0 on the database records its release (pgfence.seal): drift is named
            # against that record, and the fingerprint is the record's digest.
            row = self.read("select pgfence.version() as version, "
                            "pgfence.schema_fingerprint('pgfence') as fingerprint, "
                            "(select string_agg(d.object || ' ' || d.how, '; ' order by d.object) "
                            "from pgfence.schema_drift('pgfence') d) as drift",
                            ["version", "fingerprint", "drift"])[0]
        else:
            row = self.read(f"select pgfence.version() as version, "
                            f"({strip(self.files.query('fingerprint.sql'))}) as fingerprint, "
                            "null::text as drift", ["version", "fingerprint", "drift"])[0]
        v = None if row["version"] is None else str(row["version"])
        released = self.files.fingerprints().get(v) if v is not None else None
        fingerprint = None if released is None else str(row["fingerprint"])
        drift = None if row["drift"] is None else str(row["drift"])
        return Installed(True, v, fingerprint, released, sqitch_registry, drift)

    def installed_version(self) -> str | None:
        """pgfence.version() after an install or upgrade committed: one read."""
        v = self.read("select pgfence.version() as version", ["version"])[0]["version"]
        return None if v is None else str(v)

    def sqitch_command(self, has: Installed, release: str) -> str:
        return (f"from a checkout of pgfence {release} (git checkout v{release}): "
                'sqitch deploy "db:$DATABASE_URL"'
                + ("" if has.sqitch == "sqitch" else f" --registry {has.sqitch}"))

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

    def command(self, *words: str) -> str:
        return " ".join(["pgfence", self.target_args, *words])

    def version(self) -> dict[str, Any]:
        newest = self.files.newest()
        has = self.installed()
        doc: dict[str, Any] = {"target": self.transport.target, "installed": has.version,
                               "package": newest, "state": "", "upgrade_files": [],
                               "sqitch_registry": has.sqitch, "fingerprint": has.fingerprint,
                               "release_fingerprint": has.released, "drift": has.drift}
        if not has.schema:
            doc["state"] = "not_installed"
        elif has.version is None or not VERSION.fullmatch(has.version):
            doc["state"] = "unknown"
        elif has.drifted:
            doc["state"] = "drifted"
        elif key(has.version) > key(newest):
            doc["state"] = "newer_than_package"
        elif has.version == newest:
            doc["state"] = "up_to_date"
        else:
            chain = self.files.chain(has.version, newest)
            doc["state"] = "upgrade_available" if chain is not None else "no_upgrade_path"
            doc["upgrade_files"] = [u.name for u in chain or []]
        return doc

    def render_version(self, d: dict[str, Any]) -> str:
        confirm = f"--confirm {self.transport.target}"
        installed = {
            "not_installed": "not installed (no schema pgfence)",
            "unknown": ("unknown: schema pgfence exists, but pgfence.version() "
                        + ("is missing" if d["installed"] is None
                           else f"says {d['installed']!r}")
                        + " (older than 0.1.0, or not pgfence's)"),
            "drifted": (f"{d['installed']}, changed by hand: the schema differs from release "
                        f"{d['installed']} as released ("
                        + (d["drift"] if d.get("drift") else
                           f"fingerprint {d['fingerprint']}, the release has "
                           f"{d['release_fingerprint']}") + ")"),
        }.get(d["state"], d["installed"])
        lines = [f"target:    {d['target']}", f"installed: {installed}",
                 f"package:   {d['package']} (the newest release this package installs)"]
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
            "up_to_date": "up to date",
            "drifted": ("NOT up to date: restore the released definitions (a fresh install of "
                        f"release {d['installed']} shows them) before anything else; upgrades "
                        "refuse this schema (docs/upgrading.md)"),
            "upgrade_available": (f"upgrade available ({', '.join(d['upgrade_files'])}): "
                                  f"{upgrade}"),
            "no_upgrade_path": f"this package has no upgrade files from {d['installed']}",
            "newer_than_package": ("the database is newer than this package: upgrade the "
                                   "pgfence package before you run its commands here"),
            "unknown": "pgfence cannot install or upgrade over this schema",
        }[d["state"]])
        return "\n".join(lines)

    def install(self, given: str | None) -> dict[str, Any]:
        newest = self.files.newest()
        script = self.files.install()
        has = self.installed()
        self.refuse_other_paths(has, "install", newest)
        if has.schema:
            what = (f"pgfence {has.version} is" if has.version
                    else "a schema pgfence (without pgfence.version()) is")
            hint = (f" To move to {newest}: {self.command('upgrade')}"
                    if has.version and has.version != newest else "")
            raise Exit(EXIT_REFUSED, f"{what} already installed on {self.transport.target}: "
                       f"nothing was changed.{hint}", installed=has.version)
        self.say(f"install: pgfence {newest} ({self.files.install_file().name}, "
                 "one transaction)")
        self.confirm(given)
        self.run_scripts([script, self.expect_version(newest)], "install")
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
                       "release this package knows: install the newer pgfence package "
                       "(scripts/build in a clone of that release); nothing was changed",
                       installed=v, package=newest)
        if v == to:
            return {"target": target, "installed": v, "previous": v, "upgrade_files": [],
                    "changed": False}
        if key(v) > key(to):
            raise Exit(EXIT_REFUSED, f"{target} has pgfence {v}, newer than {to}: pgfence "
                       "never downgrades; nothing was changed", installed=v)
        chain = self.files.chain(v, to)
        if chain is None:
            raise Exit(EXIT_REFUSED, f"this package has no upgrade files from {v} to {to}: "
                       "nothing was changed", installed=v)
        self.say(f"upgrade: pgfence {v} -> {to} ({', '.join(u.name for u in chain)}, "
                 "one transaction)")
        self.confirm(given)
        self.run_scripts([*(u.text() for u in chain), self.expect_version(to)], "upgrade")
        return {"target": target, "installed": self.installed_version(), "previous": v,
                "upgrade_files": [u.name for u in chain], "changed": True}

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
        a = self.args
        if a.command == "version":
            doc = self.version()
            self.emit(doc, self.render_version)
            return EXIT_REFUSED if doc["state"] == "drifted" else EXIT_OK
        if a.command == "install":
            doc = self.install(a.confirm)
            return self.emit(doc, lambda d: f"pgfence {d['installed']} is installed on "
                             f"{d['target']}.")
        if a.command == "upgrade":
            doc = self.upgrade(self.upgrade_target(a.to), a.confirm)
            return self.emit(doc, lambda d: (
                f"pgfence {d['installed']} on {d['target']} is up to date: nothing to do."
                if not d["changed"] else
                f"pgfence on {d['target']}: {d['previous']} -> {d['installed']} "
                f"({', '.join(d['upgrade_files'])})."))
        if a.command == "status":
            return self.emit(self.status(), lambda d: table(d["resources"]) + "\n\nopen updates:\n"
                             + table(d["open_updates"])
                             + ("\n\ncounters:\n" + table(d["counters"]) if d["counters"] else "")
                             + ("\n\nprotections that stopped protecting:\n"
                                + table(d["protection_problems"]) if d["protection_problems"]
                                else ""))
        if a.command == "doctor":
            doc, code = self.doctor()
            self.emit(doc, lambda d: table(d["checks"]) + "\n\n" + (
                "healthy" if d["ok"] else
                f"{sum(not c['ok'] for c in d['checks'])} of {len(d['checks'])} checks failed"))
            return code
        if a.action == "update-status":
            token = sql.token(a.token)
            rows = self.update_status(token)
            return self.emit({"target": self.transport.target, "token": str(token),
                              "status": rows}, lambda d: table(d["status"]))
        if a.action == "prepare-update":
            resources = [sql.resource(r) for r in a.resources]
            request_id = sql.token(a.request_id, "request id") if a.request_id else uuid.uuid4()
            self.confirm(a.confirm)
            self.say(f"request id: {request_id} (rerun with --request-id {request_id} "
                     "if this is interrupted)")
            doc = self.prepare(resources, request_id)
            return self.emit(doc, lambda d: (
                f"update {d['token']} is open; its resources are paused.\n\n{table(d['status'])}"
                f"\n\nwhen every verdict is drained, deploy, then run:\n  {d['finish']}"))
        if a.action == "finish-update":
            token = sql.token(a.token)
            self.confirm(a.confirm)
            doc, code = self.finish(token)
            self.emit(doc, lambda d: table(d["results"]))
            if code != EXIT_OK:
                self.say("conflict: enabled was changed inside the window and was left as it is; "
                         "decide with pgfence.set_enabled")
            return code
        raise Exit(EXIT_USAGE, "unknown command")

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


RESOURCE_COLUMNS = ["resource", "enabled", "owner", "generation", "time_left", "stale",
                    "draining_leases", "pending_invocations", "claimed_tasks", "open_update"]
COUNTER_COLUMNS = ["resource", "generation", "lease_state", "lease_age", "takeovers",
                   "stale_results", "unfenced_writes", "queues", "queue_depth", "oldest_ready_age"]
UPDATE_STATUS_COLUMNS = ["resource", "saved_enabled", "enabled", "active_owner", "draining_leases",
                         "in_flight_tasks", "pending_invocations", "verdict", "last_heartbeat",
                         "in_flight", "unfenced_writes"]


def strip(query: str) -> str:
    """A query file's one statement, without comments or the final semicolon, to nest."""
    lines = [ln for ln in query.splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


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


def table(rows: Rows) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    cells = [[shown("" if r[c] is None else str(r[c]).lower() if isinstance(r[c], bool)
                    else str(r[c])) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in raw
    try:
        args = build_parser().parse_args(_normalize_remote(raw))
        if args.command == "init":
            return run_init(args)
        return Cli(args).run()
    except SystemExit as e:            # --help
        return int(e.code or 0)
    except Exit as e:
        return _fail(e.code, e.message, as_json, e.extra)
    except sql.BadInput as e:
        return _fail(EXIT_USAGE, str(e), as_json, {})
    except Refused as e:
        return _fail(EXIT_REFUSED, f"the database refused: {e}", as_json, {})
    except TransportFailure as e:
        return _fail(EXIT_TRANSPORT, str(e), as_json, {})
    except BrokenPackage as e:
        return _fail(EXIT_USAGE, str(e), as_json, {})


def _fail(code: int, message: str, as_json: bool, extra: dict[str, Any]) -> int:
    if as_json:
        print(json.dumps({"error": message, "exit_code": code, **extra}, indent=2))
    else:
        print(f"pgfence: {shown(message, lines=True)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`pgfence init`: pgfence's migrations and Deno client written into a user's own project.

Everything comes from this package's files (pgfence.schema_files: sql/; the Deno client:
clients/deno through src/pgfence/deno). A manifest (pgfence-init.json) records what init wrote,
with a hash of each file, so that a second run writes nothing, a file init did not write is
never overwritten, and a file of ours that someone changed is refused rather than clobbered.
All files are checked before any is written: a refusal writes nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgfence import sql
from pgfence.releases import VERSION, Files, key


@dataclass(frozen=True)
class Layer:
    needs: tuple[str, ...]   # the layers it installs onto
    after: str               # what its migration comes after, for its header
    first: str = ""          # SQL its migration runs first (what it stands on, if init can)


# The optional layers, in the order their migrations run: the repository's manifests
# (layers/NAME/layer.toml) say the same of their names and needs, which the wheel does not ship
# (tests/test_init.py ties the two).
LAYERS: dict[str, Layer] = {
    "pgmq": Layer((), "pgmq itself (Supabase Queues)", "create extension if not exists pgmq;\n\n"),
    "pgflow": Layer(("pgmq",), "pgflow's own migrations (npx pgflow install)"),
}
MANIFEST = "pgfence-init.json"
DENO = Path(__file__).resolve().parent / "deno"
# Roles that requests through the Data API run as: a lease id is a capability, never theirs.
FORBIDDEN_ROLES = {"anon", "authenticated", "public"}
PRUNE = re.compile(r"create (or replace )?function pgfence\.prune\(", re.I)
# A migration that installs pgfence: a copy of a one-file install (the first line of
# sql/pgfence.sql or a layer's, as docs/supabase.md's by-hand steps make), or one init wrote.
INSTALLS_PGFENCE = re.compile(r"^-- (pgfence [^\n]*one-file install|Written by pgfence init)",
                              re.M)
STAMP = "%Y%m%d%H%M%S"               # Supabase's migration version: 14 digits, UTC


class InitError(Exception):
    """Refused: `code` is the CLI's exit code (1 refused, 2 usage)."""

    def __init__(self, code: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


@dataclass(frozen=True)
class Planned:
    key: str        # stable across runs: which step this file is (the manifest's key)
    path: str       # relative to the project directory ('' until plan() numbers it)
    text: str
    what: str
    migration: bool
    name: str = ""          # a new migration's name, after its number


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def role_sql(name: str) -> str:
    """A role name as SQL: plain when it is a lowercase identifier, else double-quoted."""
    if name.lower() in FORBIDDEN_ROLES:
        raise InitError(2, f"--role {name}: never grant pgfence to {name} (the Data API's "
                           "request roles); name the role your trusted server code runs as")
    if not name or "\x00" in name or len(name.encode()) > 63:
        raise InitError(2, f"--role {name!r}: not a PostgreSQL role name")
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def parse_layers(value: str | None) -> list[str]:
    asked = [w.strip() for w in (value or "").split(",") if w.strip()]
    unknown = [w for w in asked if w not in LAYERS]
    if unknown:
        raise InitError(2, f"--layers: unknown layer {', '.join(unknown)} (known: "
                           f"{', '.join(LAYERS)})")
    for layer in asked:
        missing = [n for n in LAYERS[layer].needs if n not in asked]
        if missing:
            raise InitError(2, f"--layers {layer} needs the {' and '.join(missing)} layer under "
                               f"it: --layers {','.join([*missing, layer])}")
    return [layer for layer in LAYERS if layer in asked]


def header(what: str, version: str) -> str:
    return (f"-- {what}\n-- Written by pgfence init (pgfence {version}); {MANIFEST} records it. "
            "Do not edit: init refuses\n-- a changed file. Newer releases come as upgrade "
            "migrations (docs/upgrading.md).\n\n")


def deno_file(name: str, version: str) -> str:
    """A file of the Deno client, importing postgres.js by its npm specifier (the version
    clients/deno/deno.json pins), so it needs no import map wherever it is copied."""
    imports = json.loads((DENO / "deno.json").read_text())["imports"]
    text = (DENO / name).read_text()
    text = re.sub(r'from "postgres";', f'from "{imports["postgres"]}";', text)
    return (f"// Written by pgfence init (pgfence {version}) from its Deno client ({name}); "
            f"{MANIFEST} records it.\n" + text)


def worker_file(version: str, mod: str) -> str:
    text = (DENO / "examples/supabase_worker.ts").read_text()
    return (f"// Written by pgfence init (pgfence {version}): an example to make your own.\n"
            + text.replace('from "pgfence";', f'from "{mod}";'))


# Where init writes the example pgflow worker function (by layout: Supabase's or a plain one).
FLOW_WORKER_DIR = {True: "supabase/functions/pgfence-flow-worker",
                   False: "pgfence/deno/flow-worker"}


def flow_worker_file(version: str) -> str:
    """The example pgflow worker (FlowWorker.serve), its imports through its deno.json."""
    text = (DENO / "examples/pgflow_edge_function.ts").read_text()
    return (f"// Written by pgfence init (pgfence {version}): an example to make your own.\n"
            + text)


def flow_import_map(version: str, client: str) -> str:
    """The flow worker's deno.json: what its imports name (the pgflow DSL, postgres.js, the
    client init wrote into ``client``), pinned as clients/deno/deno.json pins them."""
    imports = json.loads((DENO / "deno.json").read_text())["imports"]
    return (f"// Written by pgfence init (pgfence {version}); {MANIFEST} records it. Set "
            "@pgflow/dsl to the pgflow your project runs.\n" + json.dumps({"imports": {
                "@pgflow/dsl": imports["@pgflow/dsl"],
                "postgres": imports["postgres"],
                "pgfence": f"{client}/mod.ts",
                "pgfence/pgflow": f"{client}/pgflow.ts",
            }}, indent=2) + "\n")


# The migration steps, in the order they run, and the name each gets after its number. An
# install step (the core, a layer) is upgraded by upgrade files once written; the others are
# written again when a newer release writes them differently (both are idempotent).
STEP_NAMES = {"core": "pgfence", **{name: f"pgfence_{name}" for name in LAYERS},
              "grants": "pgfence_grants", "cron": "pgfence_cron",
              "supervisor": "pgfence_supervisor"}
INSTALLS = ("core", *LAYERS)
WRITTEN_BY = re.compile(r"Written by pgfence init \(pgfence (\d+\.\d+\.\d+)\)")


def upgrade_name(step: str, release: str) -> str:
    return f"{STEP_NAMES[step]}_upgrade_{release.replace('.', '_')}"


class Project:
    """One run of init over DIR: what it would write, checked against what is there.

    Nothing is written outside DIR: every path init reads a manifest from or writes to is
    resolved under DIR, none of its components may be a symlink (a dangling one would make
    init create its target elsewhere), and the paths a manifest records must be the ones init
    itself chooses for their keys."""

    def __init__(self, directory: Path, *, supabase: bool, layers: list[str],
                 role: str | None, cron: bool, files: Files | None = None,
                 now: dt.datetime | None = None, supervise: str | None = None) -> None:
        if supervise is not None:
            if not supabase or not cron:
                raise InitError(2, "--supervise writes a pg_cron job that calls the worker "
                                   "function with pg_net, its URL in Supabase Vault: it needs "
                                   "--supabase, without --no-cron")
            try:
                sql.resource(supervise)
            except sql.BadInput as e:
                raise InitError(2, f"--supervise: {e}") from None
        self.supervise = supervise
        self.supabase = supabase
        self.layers = layers
        self.role = role
        self.cron = cron
        self.files = files or Files()
        self.now = now or dt.datetime.now(dt.UTC)
        if not directory.is_dir():
            raise InitError(2, f"{directory}: no such directory")
        self.shown = directory
        self.dir = directory.resolve()
        if supabase and not (self.dir / "supabase").is_dir():
            raise InitError(2, f"{directory} has no supabase/ folder: run init --supabase in "
                               "a Supabase project (supabase init makes one), or use --plain")
        self.base_rel = "supabase" if supabase else "pgfence"
        self.migrations_rel = f"{self.base_rel}/migrations"
        self.manifest_rel = f"{self.base_rel}/{MANIFEST}"
        self.migrations = self.inside(self.migrations_rel)
        self.manifest = self.read_manifest()

    # -- paths: inside the project, no symlinks -----------------------------------------
    def inside(self, rel: str) -> Path:
        """DIR/rel, refused (exit 1, nothing written) unless it stays inside DIR without
        passing through a symlink: an absolute path, `..`, or a symlinked folder or file on
        the way (dangling or not) is refused."""
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or any(x in ("..", ".", "") for x in parts):
            raise InitError(1, f"{rel}: not a path inside the project; nothing was written")
        here = self.dir
        for part in parts:
            here = here / part
            if here.is_symlink():
                raise InitError(1, f"{here.relative_to(self.dir)} is a symlink: pgfence init "
                                   "writes no file through one (it could lead outside the "
                                   "project); nothing was written")
        if not here.resolve().is_relative_to(self.dir):
            raise InitError(1, f"{rel} leads outside the project; nothing was written")
        return here

    def expected(self, key: str, path: str) -> bool:
        """Whether ``path`` is one init itself would choose for manifest key ``key``."""
        if key in ("deno:mod.ts", "deno:pgflow.ts", "worker", "flow-worker",
                   "flow-worker:deno.json"):
            return path in self.client_paths(key)
        match = re.fullmatch(r"migration:([a-z]+)(?:@(\d+\.\d+\.\d+))?", key)
        if not match or match.group(1) not in STEP_NAMES:
            return False
        step, release = match.groups()
        name = (upgrade_name(step, release) if release and step in INSTALLS
                else STEP_NAMES[step])
        digits = r"\d{14}" if self.supabase else r"\d{4,}"
        return re.fullmatch(rf"{re.escape(self.migrations_rel)}/{digits}_{name}\.sql",
                            path) is not None

    def read_manifest(self) -> dict[str, dict[str, str]]:
        path = self.inside(self.manifest_rel)
        if not path.exists():
            return {}
        try:
            doc = json.loads(path.read_text())
            files, default = doc["files"], str(doc.get("pgfence", ""))
            assert isinstance(files, dict)
            manifest = {str(k): {"path": str(v["path"]), "sha256": str(v["sha256"]),
                                 "release": str(v.get("release", ""))}
                        for k, v in files.items()}
        except (ValueError, KeyError, TypeError, AssertionError):
            raise InitError(1, f"{self.manifest_rel} is not a manifest pgfence init "
                               "can read: nothing was written") from None
        for name, entry in manifest.items():
            if not self.expected(name, entry["path"]):
                raise InitError(1, f"{self.manifest_rel} records {entry['path']!r} for {name}, "
                                   "a path pgfence init never writes: nothing was written "
                                   "(restore the manifest, or move it away)")
            if not entry["release"]:
                # Manifests before 0.2.2 record no release: the header of the file init wrote
                # says it (its hash is checked before anything relies on it).
                target = self.inside(entry["path"])
                found = (WRITTEN_BY.search(target.read_text()[:400])
                         if target.is_file() else None)
                entry["release"] = found.group(1) if found else default
        return manifest

    # -- what to write ------------------------------------------------------------------
    def steps(self) -> list[tuple[str, str]]:
        """(step, SQL) of each migration this release writes, in the order they run."""
        v = self.files.newest()
        out = [("core", header(f"pgfence {v}: the one-file install (sql/pgfence.sql)", v)
                + self.files.install())]
        schema = self.files.root
        for name in self.layers:
            layer = LAYERS[name]
            out.append((name, header(
                f"pgfence's {name} layer (sql/pgfence-{name}.sql), after {layer.after}", v)
                + layer.first + (schema / f"pgfence-{name}.sql").read_text()))
        if self.role is not None:
            out.append(("grants", header("pgfence's grants", v) + self.grants(self.role)))
        if self.cron:
            out.append(("cron", header("pgfence's pg_cron jobs", v) + self.cron_jobs()))
        if self.supervise is not None:
            out.append(("supervisor", header("a supervisor for the example worker "
                                             "(pg_cron + pg_net)", v)
                        + self.supervisor(self.supervise)))
        return out

    @staticmethod
    def grants(role: str) -> str:
        # The role that runs the migrations owns schema pgfence and needs no grant (nor do the
        # pg_cron jobs it schedules, which run as it); every other role does.
        return ("-- The role your server code calls pgfence as (Supabase: service_role, which "
                "supabase-js with the\n-- service key and PostgREST use; a login role that is "
                "a member of it). Never anon or\n-- authenticated: a lease id is a capability.\n"
                f"grant pgfence_worker to {role_sql(role)};\n")

    @staticmethod
    def supervisor(resource: str) -> str:
        """The job that starts the worker function for ``resource`` when its queue has work:
        the startup handshake as pgfence_pgflow.ensure_workers does it. pgfence.request_start
        gives an invocation id only while nobody holds the lease and no start is pending
        (exactly one per turn); the job posts it to the function, which acquires with it."""
        r = sql.literal(resource)
        return (
            "do $pgfence_init$\nbegin\n  if pg_catalog.to_regnamespace('net') is null then\n"
            "    if not exists (select from pg_catalog.pg_available_extensions "
            "where name = 'pg_net') then\n"
            "      raise exception 'pg_net is not available on this server'\n"
            "        using hint = 'Enable pg_net (Supabase: Database > Extensions), or run "
            "pgfence init without --supervise.';\n    end if;\n    create extension pg_net;\n"
            "  end if;\n  if pg_catalog.to_regclass('vault.decrypted_secrets') is null then\n"
            "    raise exception 'Supabase Vault (vault.decrypted_secrets) is not installed'\n"
            "      using hint = 'The supervisor reads the worker function''s URL from Vault: "
            "enable supabase_vault, or run pgfence init without --supervise.';\n  end if;\n"
            "end\n$pgfence_init$;\n\n"
            f"select pgfence.register({r});\n\n"
            "-- Every 30 seconds (every minute with a pg_cron older than 1.5): nothing until "
            "Vault has\n-- pgfence_worker_url (the function's URL; pgfence_worker_key, if "
            "there, is sent as its bearer\n-- token, docs/supabase.md); then, while the queue "
            "has a task ready, an invocation id from\n-- pgfence.request_start (NULL while a "
            "worker holds the lease or a start is pending), posted\n-- to the function, which "
            "acquires the lease with it.\n"
            f"select cron.schedule({sql.literal('pgfence-supervise-' + resource)},\n"
            "       case when (select pg_catalog.string_to_array(pg_catalog.split_part("
            "e.extversion, '-', 1), '.')::int[] < '{1,5}'\n"
            "                    from pg_catalog.pg_extension e where e.extname = 'pg_cron')\n"
            "            then '* * * * *' else '30 seconds' end,\n"
            "       $job$do $supervise$\ndeclare\n"
            "  v_url text := (select s.decrypted_secret from vault.decrypted_secrets s "
            "where s.name = 'pgfence_worker_url');\n"
            "  v_key text := (select s.decrypted_secret from vault.decrypted_secrets s "
            "where s.name = 'pgfence_worker_key');\n"
            "  v_invocation uuid;\nbegin\n"
            "  if v_url is null or not exists (select from pgfence.queue_status q "
            f"where q.queue = {r} and q.ready > 0) then\n"
            "    return;\n  end if;\n"
            f"  v_invocation := pgfence.request_start({r});\n"
            "  if v_invocation is not null then\n"
            "    perform net.http_post(url => v_url,\n"
            "      headers => jsonb_build_object('Content-Type', 'application/json')\n"
            "                 || case when v_key is null then '{}'::jsonb\n"
            "                         else jsonb_build_object('Authorization', 'Bearer ' || "
            "v_key) end,\n"
            "      body => jsonb_build_object('invocation_id', v_invocation));\n"
            "  end if;\nend\n$supervise$$job$);\n")

    def cron_jobs(self) -> str:
        text = (
            "do $pgfence_init$\nbegin\n  if pg_catalog.to_regnamespace('cron') is null then\n"
            "    if not exists (select from pg_catalog.pg_available_extensions "
            "where name = 'pg_cron') then\n"
            "      raise exception 'pg_cron is not available on this server'\n"
            "        using hint = 'Enable pg_cron (Supabase: Database > Extensions), or run "
            "pgfence init with --no-cron and schedule select pgfence.requeue_expired() '\n"
            "                     'yourself.';\n    end if;\n    create extension pg_cron;\n"
            "  end if;\nend\n$pgfence_init$;\n\n"
            "-- Tasks of workers that died come back: every 30 seconds (pg_cron 1.5+, which "
            "Supabase has),\n-- every minute with an older pg_cron.\n"
            "select cron.schedule('pgfence-requeue-expired',\n"
            "       case when (select pg_catalog.string_to_array(pg_catalog.split_part("
            "e.extversion, '-', 1), '.')::int[] < '{1,5}'\n"
            "                    from pg_catalog.pg_extension e where e.extname = 'pg_cron')\n"
            "            then '* * * * *' else '30 seconds' end,\n"
            "       'select pgfence.requeue_expired()');\n")
        if PRUNE.search(self.files.install()):
            text += ("-- Ended leases, finished tasks and closed windows older than 7 days, "
                     "daily.\nselect cron.schedule('pgfence-prune', '17 3 * * *', "
                     "'select * from pgfence.prune()');\n")
        return text

    def recorded(self, step: str) -> list[tuple[str, str]]:
        """(release, manifest key) of the migrations init wrote for ``step``, oldest first:
        its first, then the upgrades (or later versions) written after it."""
        found = [(e["release"], k) for k, e in self.manifest.items()
                 if k == f"migration:{step}" or k.startswith(f"migration:{step}@")]
        return sorted(found, key=lambda rk: (key(rk[0]) if VERSION.fullmatch(rk[0])
                                             else (0,), rk[1] != f"migration:{step}"))

    def plan(self) -> list[Planned]:
        """Every file init would write, in the order new migrations get their numbers: the
        upgrades of what an older release installed (core first, then each layer, per release
        step: a layer's upgrade to B needs pgfence B), then new installs, then the rest."""
        v = self.files.newest()
        upgrades: list[tuple[tuple[int, ...], int, Planned]] = []
        rest: list[Planned] = []
        for step, text in self.steps():
            what = text.partition("\n")[0].removeprefix("-- ")
            had = self.recorded(step)
            if not had:
                rest.append(self.migration(f"migration:{step}", STEP_NAMES[step], text, what))
                continue
            release, last = had[-1]
            current = self.manifest_text(last)
            if current and sha(current) != self.manifest[last]["sha256"]:
                # Changed by hand since init wrote it: actions() refuses it, whatever release.
                rest.append(Planned(last, self.manifest[last]["path"], text, what, True))
                continue
            if not VERSION.fullmatch(release) or key(release) > key(v):
                raise InitError(1, f"{self.manifest[last]['path']} was written by pgfence init "
                                   f"{release or '(unknown)'}, newer than this package ({v}): "
                                   "upgrade the pgfence package; nothing was written")
            if release == v or (step not in INSTALLS and unversioned(current)
                                == unversioned(text)):
                # As this release writes it (other options are refused), or applied already:
                # an upgrade of this release, the same SQL under an older release's header.
                regenerated = release == v and (step not in INSTALLS
                                                or last == f"migration:{step}")
                rest.append(Planned(last, self.manifest[last]["path"],
                                    text if regenerated else current, what, True))
            elif step in INSTALLS:
                chain = (self.files.chain(release, v) if step == "core"
                         else self.files.layer_chain(step, release, v))
                if chain is None:
                    raise InitError(1, f"this package has no upgrade files from pgfence "
                                       f"{release} to {v}: nothing was written")
                for u in chain:
                    name = u.name
                    upgrades.append((key(u.target), INSTALLS.index(step), self.migration(
                        f"migration:{step}@{u.target}", upgrade_name(step, u.target),
                        header(f"upgrade {u.source} -> {u.target} of what an older pgfence "
                               f"init installed (sql/upgrades/{name})", v) + u.text(),
                        f"upgrade {u.source} -> {u.target} (sql/upgrades/{name})")))
            else:
                rest.append(self.migration(f"migration:{step}@{v}", STEP_NAMES[step], text,
                                           what + f" as {v} writes them"))
        ordered = [p for *_, p in sorted(upgrades, key=lambda x: (x[0], x[1]))] + rest
        fresh = self.first_new_version()
        planned = []
        for p in ordered:
            if p.path:
                planned.append(p)
            else:
                planned.append(Planned(p.key, f"{self.migrations_rel}/"
                                       f"{self.version_name(fresh)}_{p.name}.sql",
                                       p.text, p.what, True))
                fresh += 1
        return planned + self.client_files()

    def migration(self, manifest_key: str, name: str, text: str, what: str) -> Planned:
        """A migration at the path the manifest records for it, or, unrecorded, without a
        path yet (plan() numbers the new ones in order)."""
        known = self.manifest.get(manifest_key)
        return Planned(manifest_key, known["path"] if known else "", text, what, True,
                       name=name)

    def manifest_text(self, manifest_key: str) -> str:
        target = self.inside(self.manifest[manifest_key]["path"])
        return target.read_text() if target.is_file() else ""

    def client_files(self) -> list[Planned]:
        v = self.files.newest()
        if self.supabase:
            shared = Path("supabase/functions/_shared/pgfence")
            client = [("mod.ts", str(shared / "mod.ts"))]
            if "pgflow" in self.layers:
                client.append(("pgflow.ts", str(shared / "pgflow.ts")))
            worker = ("supabase/functions/pgfence-worker/index.ts", "../_shared/pgfence/mod.ts")
        else:
            client = [("mod.ts", "pgfence/deno/mod.ts")]
            if "pgflow" in self.layers:
                client.append(("pgflow.ts", "pgfence/deno/pgflow.ts"))
            worker = ("pgfence/deno/worker.ts", "./mod.ts")
        planned = [Planned(f"deno:{name}", path, deno_file(name, v),
                           f"the Deno client ({name})", False) for name, path in client]
        planned.append(Planned("worker", worker[0], worker_file(v, worker[1]),
                               "an example worker (startup handshake, fenced claim/complete)",
                               False))
        if "pgflow" in self.layers:
            # pgflow's worker layout: a function of its own with its deno.json (import map).
            flow_dir = FLOW_WORKER_DIR[self.supabase]
            client_dir = "../_shared/pgfence" if self.supabase else ".."
            planned.append(Planned("flow-worker", f"{flow_dir}/index.ts", flow_worker_file(v),
                                   "an example pgflow worker (FlowWorker.serve: what "
                                   "ensure_workers starts)", False))
            planned.append(Planned("flow-worker:deno.json", f"{flow_dir}/deno.json",
                                   flow_import_map(v, client_dir),
                                   "the pgflow worker's import map", False))
        return planned

    def client_paths(self, manifest_key: str) -> set[str]:
        """Where init writes a client file in this layout (pgflow.ts whatever --layers says,
        so that a manifest from a run with the pgflow layer is read by one without it)."""
        base = "supabase/functions/_shared/pgfence" if self.supabase else "pgfence/deno"
        flow = FLOW_WORKER_DIR[self.supabase]
        return {"deno:mod.ts": {f"{base}/mod.ts"}, "deno:pgflow.ts": {f"{base}/pgflow.ts"},
                "worker": {"supabase/functions/pgfence-worker/index.ts" if self.supabase
                           else "pgfence/deno/worker.ts"},
                "flow-worker": {f"{flow}/index.ts"},
                "flow-worker:deno.json": {f"{flow}/deno.json"}}.get(manifest_key, set())

    # Migration names: Supabase's are timestamps (after the project's last migration, one
    # second apart, so they run in this order); a plain project's are numbers.
    def first_new_version(self) -> int:
        last = max((int(m.group(1)) for p in self.migrations.glob("*.sql")
                    if (m := re.match(r"(\d+)_", p.name))), default=0)
        if not self.supabase:
            return last + 1
        now = int(self.now.strftime(STAMP))
        return max(now, self.next_second(last)) if last else now

    @staticmethod
    def next_second(version: int) -> int:
        try:
            t = dt.datetime.strptime(str(version), STAMP)
        except ValueError:
            return version + 1
        return int((t + dt.timedelta(seconds=1)).strftime(STAMP))

    def version_name(self, n: int) -> str:
        return str(n) if self.supabase else f"{n:04d}"

    # -- checking and writing -----------------------------------------------------------
    def actions(self) -> list[dict[str, str]]:
        """Each planned file with what init does to it: write, update, keep, or a refusal."""
        out = []
        for p in self.plan():
            target = self.inside(p.path)
            recorded = self.manifest.get(p.key)
            if not target.exists():
                action = "write"
            else:
                current = target.read_text()
                if recorded is None or recorded["path"] != p.path:
                    action = "refused: there already, not written by init"
                elif sha(current) != recorded["sha256"]:
                    action = "refused: changed since init wrote it"
                elif current == p.text:
                    action = "keep"
                elif p.migration:
                    action = ("refused: init wrote it differently (other options); a migration "
                              "is never rewritten")
                else:
                    action = "update"
            out.append({"path": p.path, "action": action, "what": p.what, "key": p.key})
        return out

    def installed_elsewhere(self) -> list[str]:
        """Migrations not in the manifest that install pgfence or a layer already: a second
        install would fail at push (pgfence is upgraded, never reinstalled)."""
        ours = {v["path"] for v in self.manifest.values()}
        rel = f"{self.migrations_rel}/"
        return [rel + m.name for m in sorted(self.migrations.glob("*.sql"))
                if rel + m.name not in ours and m.is_file()
                and INSTALLS_PGFENCE.search(m.read_text()[:4000])]

    def run(self, dry_run: bool) -> dict[str, Any]:
        plan = {p.key: p for p in self.plan()}
        actions = self.actions()
        elsewhere = self.installed_elsewhere()
        if elsewhere:
            raise InitError(1, f"nothing was written: {', '.join(elsewhere)} already install"
                               f"{'s' if len(elsewhere) == 1 else ''} pgfence (copied by hand, "
                               f"or written by an init whose {MANIFEST} is gone); upgrade it "
                               "with the upgrade files instead (docs/upgrading.md)")
        refused = [a for a in actions if a["action"].startswith("refused")]
        changes = [a for a in actions if a["action"] in ("write", "update")]
        doc: dict[str, Any] = {
            "project": str(self.shown), "layout": "supabase" if self.supabase else "plain",
            "pgfence": self.files.newest(), "layers": self.layers, "dry_run": dry_run,
            "files": [{k: a[k] for k in ("path", "action", "what")} for a in actions],
            "changed": bool(changes) and not dry_run and not refused}
        if refused:
            raise InitError(1, "nothing was written: " + "; ".join(
                f"{a['path']} {a['action'].removeprefix('refused: ')}" for a in refused)
                + " (move it away to let init write it)", files=doc["files"])
        if dry_run or not changes:
            return doc
        v = self.files.newest()
        manifest = {k: dict(e) for k, e in self.manifest.items()}
        for a in changes:
            p = plan[a["key"]]
            write(self.inside(p.path), p.text, new=a["action"] == "write", root=self.dir)
            # An upgrade's release is the one it upgrades to; anything else is this release's.
            manifest[p.key] = {"path": p.path, "sha256": sha(p.text),
                               "release": p.key.partition("@")[2] or v}
        write(self.inside(self.manifest_rel), json.dumps(
            {"pgfence": v, "files": dict(sorted(manifest.items()))}, indent=2) + "\n",
            new=not self.inside(self.manifest_rel).exists(), root=self.dir)
        return doc


def unversioned(text: str) -> str:
    """A migration without the release its header names: the same SQL from another release."""
    return WRITTEN_BY.sub("", text, count=1)


def write(target: Path, text: str, *, new: bool, root: Path) -> None:
    """Writes a file without following a symlink: a new one must not exist (O_EXCL, which
    also refuses a dangling symlink put there since the check), an existing one is replaced
    in place (O_NOFOLLOW). Its folders are made one by one, each checked again."""
    here = root
    for part in target.relative_to(root).parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise InitError(1, f"{here.relative_to(root)} is a symlink: nothing more was "
                               "written")
        if not here.exists():
            here.mkdir()
    flags = os.O_WRONLY | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if new else os.O_TRUNC)
    try:
        fd = os.open(target, flags, 0o644)
    except OSError as e:        # EEXIST, ELOOP: something was put there since the check
        raise InitError(1, f"{target.relative_to(root)}: {e.strerror}; not written (init writes "
                           "no file through a symlink, and no new file over one)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def render(doc: dict[str, Any]) -> str:
    layout = "Supabase project" if doc["layout"] == "supabase" else "project"
    layers = ", ".join(doc["layers"]) or "none"
    lines = [f"pgfence init: {layout} {doc['project']} (pgfence {doc['pgfence']}, "
             f"layers: {layers})"]
    verb = {"write": "would write" if doc["dry_run"] else "wrote",
            "update": "would update" if doc["dry_run"] else "updated", "keep": "unchanged"}
    width = max(len(v) for v in verb.values())
    lines += [f"  {verb[f['action']].ljust(width)}  {f['path']}" for f in doc["files"]]
    changed = [f for f in doc["files"] if f["action"] in ("write", "update")]
    if not changed:
        lines.append("nothing to write: every file is as pgfence init wrote it")
    elif doc["dry_run"]:
        lines.append(f"dry run: {len(changed)} files, nothing was written")
    else:
        apply = ("supabase db push (the local stack; --remote for the linked project)"
                 if doc["layout"] == "supabase" else
                 "psql -f each of pgfence/migrations/*.sql, in order")
        lines.append(f"next: apply the migrations with {apply}")
    return "\n".join(lines)

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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgfence.releases import Files


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
    path: str       # relative to the project directory
    text: str
    what: str
    migration: bool


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


class Project:
    """One run of init over DIR: what it would write, checked against what is there."""

    def __init__(self, directory: Path, *, supabase: bool, layers: list[str],
                 role: str | None, cron: bool, files: Files | None = None,
                 now: dt.datetime | None = None) -> None:
        self.dir = directory
        self.supabase = supabase
        self.layers = layers
        self.role = role
        self.cron = cron
        self.files = files or Files()
        self.now = now or dt.datetime.now(dt.UTC)
        if not directory.is_dir():
            raise InitError(2, f"{directory}: no such directory")
        if supabase and not (directory / "supabase").is_dir():
            raise InitError(2, f"{directory} has no supabase/ folder: run init --supabase in "
                               "a Supabase project (supabase init makes one), or use --plain")
        self.base = directory / ("supabase" if supabase else "pgfence")
        self.migrations = self.base / "migrations"
        self.manifest_path = self.base / MANIFEST
        self.manifest = self.read_manifest()

    def read_manifest(self) -> dict[str, dict[str, str]]:
        if not self.manifest_path.exists():
            return {}
        try:
            files = json.loads(self.manifest_path.read_text())["files"]
            assert isinstance(files, dict)
            return {str(k): {"path": str(v["path"]), "sha256": str(v["sha256"])}
                    for k, v in files.items()}
        except (ValueError, KeyError, TypeError, AssertionError):
            raise InitError(1, f"{self.rel(self.manifest_path)} is not a manifest pgfence init "
                               "can read: nothing was written") from None

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.dir))

    # -- what to write ------------------------------------------------------------------
    def steps(self) -> list[tuple[str, str, str]]:
        """(key, name, SQL) of each migration, in the order they must run."""
        v = self.files.newest()
        out = [("core", "pgfence", header(f"pgfence {v}: the one-file install (sql/pgfence.sql)",
                                          v) + self.files.install())]
        schema = self.files.root
        for name in self.layers:
            layer = LAYERS[name]
            out.append((name, f"pgfence_{name}", header(
                f"pgfence's {name} layer (sql/pgfence-{name}.sql), after {layer.after}", v)
                + layer.first + (schema / f"pgfence-{name}.sql").read_text()))
        if self.role is not None:
            out.append(("grants", "pgfence_grants", header("pgfence's grants", v)
                        + self.grants(self.role)))
        if self.cron:
            out.append(("cron", "pgfence_cron", header("pgfence's pg_cron jobs", v)
                        + self.cron_jobs()))
        return out

    @staticmethod
    def grants(role: str) -> str:
        # The role that runs the migrations owns schema pgfence and needs no grant (nor do the
        # pg_cron jobs it schedules, which run as it); every other role does.
        return ("-- The role your server code calls pgfence as (Supabase: service_role, which "
                "supabase-js with the\n-- service key and PostgREST use; a login role that is "
                "a member of it). Never anon or\n-- authenticated: a lease id is a capability.\n"
                f"grant pgfence_worker to {role_sql(role)};\n")

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

    def plan(self) -> list[Planned]:
        v = self.files.newest()
        planned: list[Planned] = []
        fresh = self.first_new_version()
        for key, name, text in self.steps():
            known = self.manifest.get(f"migration:{key}")
            if known:
                path = known["path"]
            else:
                path = self.rel(self.migrations / f"{self.version_name(fresh)}_{name}.sql")
                fresh += 1
            # What the header's first line says, e.g. "pgfence's grants".
            what = text.partition("\n")[0].removeprefix("-- ")
            planned.append(Planned(f"migration:{key}", path, text, what, True))
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
        for name, path in client:
            planned.append(Planned(f"deno:{name}", path, deno_file(name, v),
                                   f"the Deno client ({name})", False))
        planned.append(Planned("worker", worker[0], worker_file(v, worker[1]),
                               "an example worker (startup handshake, fenced claim/complete)",
                               False))
        return planned

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
            target = self.dir / p.path
            recorded = self.manifest.get(p.key)
            if not target.exists():
                action = "write"
            else:
                current = target.read_text()
                ours = recorded is not None and recorded["path"] == p.path
                if current == p.text:
                    action = "keep" if ours else "refused: there already, not written by init"
                elif not ours:
                    action = "refused: there already, not written by init"
                elif recorded is not None and sha(current) != recorded["sha256"]:
                    action = "refused: changed since init wrote it"
                elif p.migration:
                    action = ("refused: init wrote it differently (other options or release); "
                              "a migration is never rewritten")
                else:
                    action = "update"
            out.append({"path": p.path, "action": action, "what": p.what, "key": p.key})
        return out

    def installed_elsewhere(self) -> list[str]:
        """Migrations not in the manifest that install pgfence or a layer already: a second
        install would fail at push (pgfence is upgraded, never reinstalled)."""
        ours = {v["path"] for v in self.manifest.values()}
        return [self.rel(m) for m in sorted(self.migrations.glob("*.sql"))
                if self.rel(m) not in ours and INSTALLS_PGFENCE.search(m.read_text()[:4000])]

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
            "project": str(self.dir), "layout": "supabase" if self.supabase else "plain",
            "pgfence": self.files.newest(), "layers": self.layers, "dry_run": dry_run,
            "files": [{k: a[k] for k in ("path", "action", "what")} for a in actions],
            "changed": bool(changes) and not dry_run and not refused}
        if refused:
            raise InitError(1, "nothing was written: " + "; ".join(
                f"{a['path']} {a['action'].removeprefix('refused: ')}" for a in refused)
                + " (move it away to let init write it)", files=doc["files"])
        if dry_run or not changes:
            return doc
        manifest = dict(self.manifest)
        for a in changes:
            p = plan[a["key"]]
            target = self.dir / p.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(p.text)
            manifest[p.key] = {"path": p.path, "sha256": sha(p.text)}
        self.manifest_path.write_text(json.dumps(
            {"pgfence": self.files.newest(), "files": dict(sorted(manifest.items()))},
            indent=2) + "\n")
        return doc


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

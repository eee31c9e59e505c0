"""Linters on the SQL: pgspot on the one-file install (search_path safety of what it creates
and runs as its installer), squawk on the Sqitch deploy scripts (what a migration does to a
live database; its rules and every exclusion, with the reason, are in .squawk.toml).

Each has a negative control: a copy with one unsafe statement added must be flagged.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from testkit import install, layers
from tests.support import ROOT

BIN = Path(sys.executable).parent
SQUAWK_CONFIG = ROOT / ".squawk.toml"


# Functions on the hot paths that have no SET search_path, on purpose: a SET makes every call
# save and restore the setting and recompute the search path, and keeps a LANGUAGE sql function
# from being inlined. None is SECURITY DEFINER; each names everything with its schema, which
# pgspot still checks (any unqualified name in them is reported).
WITHOUT_SEARCH_PATH = (
    "pgfence.check_name(arg text,value text)",
    "pgfence.check_interval(arg text,value interval)",
    "pgfence.interval_ok(value interval)",
    "pgfence.check_not_null(arg text,value anyelement)",
    "pgfence.sign(message text,key bytea)",
    "pgfence.fence_token(resource text,key bytea)",
    "pgfence.attempt_uuid(task_id bigint,attempt integer,lease_id uuid,key bytea)",
    "pgfence.attempt_task(attempt_id uuid)",
    "pgfence.attempt_holds(task_id bigint,attempt integer,lease_id uuid,reported boolean,key bytea,"
    "attempt_id uuid)",
    "pgfence.hmac(message text,key bytea)",
    "pgfence.limit_idle()",
    "pgfence.attempt_uuid_0_1(task_id bigint,attempt integer,lease_id uuid,key bytea)",
    "pgfence.is_current(state text,expires_at timestamptz)",
    "pgfence.is_live(state text,expires_at timestamptz)",
    "pgfence.hold_current(lease_id uuid)",
    "pgfence.mark_fenced(resource text,key bytea)",
    "pgfence_pgmq.attempt_uuid(msg_id bigint,read_ct integer)",
    "pgfence_pgmq.queue_table(queue text)",
    "pgfence_pgmq.check_allowed(queue_table text,write text,archive boolean)",
    "pgfence.invoker()",
    "pgfence.check_batch(attempt_ids uuid[])",
    "pgfence_pgmq.archive(attempt_id uuid)",
    "pgfence_pgmq.mark(queue_table text,lease_id uuid)",
    "pgfence_pgmq.delete(attempt_id uuid)",
    "pgfence_pgmq.archive_many(attempt_ids uuid[],attempt_id uuid,outcome text)",
    "pgfence_pgmq.delete_many(attempt_ids uuid[],attempt_id uuid,outcome text)",
    "pgfence_pgflow.worker_id(lease_id uuid,key bytea)",
    "pgfence_pgflow.check_allowed(fn regprocedure)",
    "pgfence_pgflow.complete_task(attempt_id uuid,output jsonb)",
    "pgfence_pgflow.fail_task(attempt_id uuid,error_message text)",
    # 0.3.1: the pgflow layer's batch, wrappers of finish_many (plpgsql: their plans kept).
    "pgfence_pgflow.complete_many(attempt_ids uuid[],outputs jsonb[],attempt_id uuid,outcome text)",
    "pgfence_pgflow.fail_many(attempt_ids uuid[],error_messages text[],attempt_id uuid,"
    "outcome text)",
    # 0.3.0: what the layers call on their hot paths (pgfence's layer_api), and the pgflow
    # layer's stall rule, inlined into its start's statements.
    "pgfence.hold_fenced(lease_id uuid)",
    "pgfence.mark_lease(lease_id uuid,tbl regclass)",
    "pgfence.owner_ref(lease_id uuid,purpose text,OUT resource text,OUT ref uuid)",
    "pgfence.limit_lock_wait()",
    "pgfence_pgflow.stalled(started_at timestamptz,timeout integer,visible boolean,"
    "lease_live boolean)",
    "pgfence_pgflow.start_lease_live(run_id uuid,step_slug text,task_index integer,"
    "attempts_count integer)",
)


def pgspot(*paths: Path, append: bool = False) -> subprocess.CompletedProcess[str]:
    allowed = [arg for proc in WITHOUT_SEARCH_PATH for arg in ("--proc-without-search-path", proc)]
    return subprocess.run([BIN / "pgspot", *(["-a"] if append else []), *allowed, *map(str, paths)],
                          capture_output=True, text=True)


def squawk(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN / "squawk", "--config", str(SQUAWK_CONFIG), "--reporter", "gcc",
                           *map(str, paths)], capture_output=True, text=True, cwd=ROOT)


def test_pgspot_finds_nothing_in_the_bundle() -> None:
    out = pgspot(ROOT / "sql/pgfence.sql")
    report = out.stdout + out.stderr
    # A statement pgspot cannot parse ends its analysis there, so it must not happen either.
    assert out.returncode == 0 and "Errors: 0 Warnings: 0 Unknown: 0" in report, report


@pytest.mark.parametrize("layer", layers.names())
def test_pgspot_finds_nothing_in_a_layer(layer: str) -> None:
    # Read after pgfence and the layers it needs (-a), which it is installed onto; the third
    # party's own SQL (pgmq's, pgflow's) is theirs.
    out = pgspot(*install.files([layer]), append=True)
    report = out.stdout + out.stderr
    assert out.returncode == 0 and "TOTAL: Errors: 0 Warnings: 0 Unknown: 0" in report, report


UPGRADES = sorted((ROOT / "sql/upgrades").glob("*.sql"))


@pytest.mark.parametrize("upgrade", UPGRADES, ids=lambda p: p.name)
def test_pgspot_finds_nothing_in_an_upgrade_over_its_release(upgrade: Path) -> None:
    # Read after the release it upgrades (-a): its `create or replace` then replaces pgfence's
    # own functions in pgfence's own schema, which is safe, and not someone else's. A layer's
    # upgrade (pgfence-LAYER--A--B.sql) is read after pgfence B and, of release A, the layer
    # and those it needs, which it is installed onto.
    name, old, new = upgrade.name.removesuffix(".sql").split("--")
    before = [ROOT / f"sql/releases/pgfence--{old}.sql"]
    if name != "pgfence":
        core = ROOT / f"sql/releases/pgfence--{new}.sql"  # the head's, before B is tagged:
        before = [core if core.is_file() else ROOT / "sql/pgfence.sql",
                  *(ROOT / f"sql/releases/pgfence-{layer.name}--{old}.sql"
                    for layer in layers.with_needs([name.removeprefix("pgfence-")]))]
    out = pgspot(*before, upgrade, append=True)
    report = out.stdout + out.stderr
    assert out.returncode == 0 and "TOTAL: Errors: 0 Warnings: 0 Unknown: 0" in report, report


def test_negative_control_pgspot_flags_an_unsafe_function(tmp_path: Path) -> None:
    bundle = tmp_path / "pgfence.sql"
    bundle.write_text("""
create function public.unsafe() returns text language sql security definer
as $$ select format('%s', current_user) $$;
""" + (ROOT / "sql/pgfence.sql").read_text())
    out = pgspot(bundle)
    assert out.returncode != 0
    assert "PS003" in out.stdout, out.stdout


def test_negative_control_pgspot_checks_names_where_no_search_path(tmp_path: Path) -> None:
    # pgfence.sign and pgfence.hmac with their built-ins left unqualified: an object in the
    # caller's search_path could stand in for them, and pgspot must say so although they may
    # go without a SET.
    text = (ROOT / "sql/pgfence.sql").read_text()
    assert text.count("pg_catalog.sha256(") == 3  # one in sign, two in hmac
    bundle = tmp_path / "pgfence.sql"
    bundle.write_text(text.replace("pg_catalog.sha256(", "sha256("))
    out = pgspot(bundle)
    assert out.returncode != 0
    assert "PS016: Unqualified function call: sha256" in out.stdout, out.stdout


def test_squawk_finds_nothing_in_the_migrations() -> None:
    out = squawk(*sorted((ROOT / "migrations/deploy").glob("*.sql")),
                 *sorted((ROOT / "layers").glob("*/deploy/*.sql")))
    assert out.returncode == 0, out.stdout + out.stderr


def test_negative_control_squawk_flags_a_blocking_index_build(tmp_path: Path) -> None:
    migration = tmp_path / "owner_index.sql"
    migration.write_text("begin;\ncreate index leases_owner on pgfence.leases (owner);\ncommit;\n")
    out = squawk(migration)
    assert out.returncode != 0
    assert "require-concurrent-index-creation" in out.stdout, out.stdout
    assert "require-lock-timeout" in out.stdout, out.stdout


def test_every_squawk_exclusion_is_justified() -> None:
    text = SQUAWK_CONFIG.read_text()
    excluded = tomllib.loads(text).get("excluded_rules", [])
    for rule in excluded:
        # The rule's entry is preceded by at least one comment line.
        assert re.search(rf"(?m)^\s*#.*\n\s*\"{re.escape(rule)}\"", text), rule
    assert set(excluded) <= {"require-statement-timeout", "prefer-bigint-over-int"}, (
        "a new exclusion: justify it in .squawk.toml and here")

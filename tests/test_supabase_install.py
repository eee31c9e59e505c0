"""The Supabase install path: sql/pgfence.sql as a migration pushed by the real Supabase CLI
(`supabase db push --remote=<url>`), as a database owner that is not a superuser, on a
cluster with Supabase's roles and default privileges that hand every new function to `anon`
and `authenticated`. Then the pgTAP suite runs against the result."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from tests.support import HUNG, ROOT, SUPABASE, install_test_helpers

OWNER = "supabase_owner_test"

SUPABASE_ROLES = f"""
do $$
declare
  r text;
begin
  foreach r in array array['anon', 'authenticated', 'service_role'] loop
    if not exists (select from pg_roles where rolname = r) then
      execute format('create role %I nologin', r);
    end if;
  end loop;
  if not exists (select from pg_roles where rolname = '{OWNER}') then
    -- Like Supabase's postgres role: owns the database, creates roles, is no superuser.
    create role {OWNER} login createrole;
  end if;
end $$;
"""

# Worse than Supabase's defaults on purpose: every function, table and schema the owner
# creates, anywhere, is handed to anon and authenticated.
HOSTILE_DEFAULTS = f"""
alter default privileges for role {OWNER} grant execute on functions to anon, authenticated;
alter default privileges for role {OWNER} grant all on tables to anon, authenticated;
alter default privileges for role {OWNER} grant usage on schemas to anon, authenticated;
"""

PGMQ_FOR_OWNER = f"""
grant usage on schema pgmq to {OWNER};
grant all on all tables in schema pgmq to {OWNER};
grant all on all sequences in schema pgmq to {OWNER};
alter default privileges in schema pgmq grant all on tables to {OWNER};
alter default privileges in schema pgmq grant all on sequences to {OWNER};
"""

FOREIGN_GRANTS = """
select count(*) from (
  select p.oid from pg_proc p where p.pronamespace = 'pgfence'::regnamespace
     and (has_function_privilege('anon', p.oid, 'execute')
          or has_function_privilege('authenticated', p.oid, 'execute'))
  union all
  select c.oid from pg_class c where c.relnamespace = 'pgfence'::regnamespace
     and (has_table_privilege('anon', c.oid, 'select, insert, update, delete')
          or has_table_privilege('authenticated', c.oid, 'select, insert, update, delete'))) x
"""


def push(database: str, migration: str, workdir: Path,
         *more: str) -> subprocess.CompletedProcess[str]:
    """`supabase db push` of pgfence's migration, and of `more` after it, in order."""
    migrations = workdir / "supabase" / "migrations"
    migrations.mkdir(parents=True)
    (migrations / "20261129000000_pgfence.sql").write_text(migration)
    for n, text in enumerate(more, start=1):
        (migrations / f"20261129{n:06d}_pgfence_layer.sql").write_text(text)
    url = f"postgresql://{OWNER}@127.0.0.1:{os.environ['PGPORT']}/{database}"
    return subprocess.run([str(SUPABASE), "db", "push", "--workdir", str(workdir),
                           f"--remote={url}", "--yes", "--agent", "no"],
                          capture_output=True, text=True, timeout=HUNG)


@pytest.fixture
def supabase_db(cluster: Cluster) -> Iterator[str]:
    name = f"sb_{uuid.uuid4().hex[:10]}"
    cluster.psql("postgres", "-c", SUPABASE_ROLES, "-c", f"create database {name} owner {OWNER}")
    cluster.psql(name, "-c", HOSTILE_DEFAULTS)
    yield name
    cluster.drop_database(name)


def test_supabase_db_push_installs_pgfence_out_of_reach_of_anon(cluster: Cluster, supabase_db: str,
                                                                tmp_path: Path) -> None:
    out = push(supabase_db, (ROOT / "sql/pgfence.sql").read_text(), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert cluster.psql(supabase_db, "-At", "-c", FOREIGN_GRANTS).strip() == "0"
    # As anon, as a request through PostgREST would run: nothing.
    denied = subprocess.run(["psql", "-X", "-d", supabase_db, "-c", "set role anon",
                             "-c", "select pgfence.acquire('r', 'x', '30 s')"],
                            capture_output=True, text=True)
    assert "permission denied" in denied.stderr
    # The documented grant: the server side (service_role) works as a worker.
    cluster.psql(supabase_db, "-c", "grant pgfence_worker to service_role",
                 "-c", "select pgfence.register('edge-fn')")
    granted = cluster.psql(supabase_db, "-At", "-c", "set role service_role", "-c", "select "
                           "generation > 0 from pgfence.acquire('edge-fn', 'isolate', '30 s')")
    assert granted.strip().splitlines()[-1] == "t"


def test_negative_control_without_lockdown_anon_gets_in(cluster: Cluster, supabase_db: str,
                                                        tmp_path: Path) -> None:
    bundle = (ROOT / "sql/pgfence.sql").read_text()
    without_lockdown = bundle[:bundle.index("-- change: lockdown")]
    out = push(supabase_db, without_lockdown, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert int(cluster.psql(supabase_db, "-At", "-c", FOREIGN_GRANTS).strip()) > 0


def test_pgtap_suite_passes_on_the_supabase_install(cluster: Cluster, supabase_db: str,
                                                     tmp_path: Path) -> None:
    # With Supabase Queues (pgmq, enabled from the dashboard as the extension) and pgfence's
    # pgmq layer as a second migration, whose pgTAP tests are in the suite.
    # On Supabase the postgres role, which runs migrations, may use pgmq's schema and its queue
    # tables (and owns the queues it creates): the same for the owner here, also for queues the
    # tests create later as a superuser.
    cluster.psql(supabase_db, "-c", "create extension pgmq", "-c", PGMQ_FOR_OWNER)
    out = push(supabase_db, (ROOT / "sql/pgfence.sql").read_text(), tmp_path,
               (ROOT / "sql/pgfence-pgmq.sql").read_text())
    assert out.returncode == 0, out.stdout + out.stderr
    cluster.psql(supabase_db, "-c", "create extension pgtap")
    install_test_helpers(cluster, supabase_db)
    # The core's suite and the pgmq layer's: the pgflow layer (pgtap/pgflow) is not pushed here.
    files = sorted(str(p) for p in (ROOT / "pgtap").rglob("*.sql")
                   if not {"helpers", "pgflow"} & set(p.parts))
    prove = subprocess.run(["pg_prove", "-d", supabase_db, *files], capture_output=True,
                           text=True, timeout=HUNG)
    assert prove.returncode == 0, prove.stdout[-3000:] + prove.stderr[-2000:]
    assert "All tests successful." in prove.stdout

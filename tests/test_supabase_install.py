"""The Supabase install path: sql/pgfence.sql as a migration pushed by the real Supabase CLI
(`supabase db push --remote=<url>`), as a database owner that is not a superuser, on a
cluster with Supabase's roles and default privileges that hand every new function to `anon`
and `authenticated`. Then the pgTAP suite runs against the result."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import install, layers
from testkit.cluster import Cluster
from tests.support import HUNG, ROOT, SUPABASE

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

# A role unrelated to pgfence, which the hostile defaults below hand everything to as well.
BYSTANDER = "bystander_test"

# Worse than Supabase's defaults on purpose: every function, table, sequence, type and schema
# the owner creates, anywhere, is handed to anon, authenticated and a bystander.
HOSTILE_DEFAULTS = f"""
do $$ begin
  if not exists (select from pg_roles where rolname = '{BYSTANDER}') then
    create role {BYSTANDER} nologin;
  end if;
end $$;
""" + "".join(f"alter default privileges for role {OWNER} grant {what} "
              f"to anon, authenticated, {BYSTANDER};\n"
              for what in ("execute on functions", "all on tables", "all on sequences",
                           "usage on types", "usage on schemas"))

# Any privilege of anon, authenticated or the bystander on any pgfence schema (the core's and
# each layer's) or anything in it: schemas, functions, relations, columns, types.
ANY_FOREIGN_PRIVILEGE = f"""
with schemas as (select oid, nspname from pg_namespace
                  where nspname = 'pgfence' or nspname like 'pgfence\\_%'),
     roles(r) as (values ('anon'), ('authenticated'), ('{BYSTANDER}'))
select coalesce(string_agg(what, ', ' order by what), '') from (
  select format('%s: schema %s', r, n.nspname) as what from schemas n, roles
   where has_schema_privilege(r, n.oid, 'usage') or has_schema_privilege(r, n.oid, 'create')
  union all
  select format('%s: function %s', r, p.oid::regprocedure)
    from pg_proc p join schemas n on n.oid = p.pronamespace, roles
   where has_function_privilege(r, p.oid, 'execute')
  union all
  select format('%s: %s', r, c.oid::regclass)
    from pg_class c join schemas n on n.oid = c.relnamespace, roles
   where c.relkind in ('r', 'v', 'm', 'p', 'f')
     and has_table_privilege(r, c.oid,
                             'select, insert, update, delete, truncate, references, trigger')
  union all
  select format('%s: sequence %s', r, c.oid::regclass)
    from pg_class c join schemas n on n.oid = c.relnamespace, roles
   where c.relkind = 'S' and has_sequence_privilege(r, c.oid, 'usage, select, update')
  union all
  select format('%s: column %s.%s', r, c.oid::regclass, a.attname)
    from pg_class c join schemas n on n.oid = c.relnamespace
    join pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped, roles
   where has_column_privilege(r, c.oid, a.attnum, 'select, insert, update, references')
  union all
  select format('%s: type %s', r, t.oid::regtype)
    from pg_type t join schemas n on n.oid = t.typnamespace, roles
   where t.typtype in ('d', 'e', 'r', 'm') and t.typacl is not null
     and has_type_privilege(r, t.oid, 'usage')
) x
"""

def for_owner(schema: str) -> str:
    """What the owner may do in a third party's schema (pgmq's, say), as Supabase's postgres role
    may: use it, its tables and sequences, also those made later."""
    return f"""
grant usage on schema {schema} to {OWNER};
grant all on all tables in schema {schema} to {OWNER};
grant all on all sequences in schema {schema} to {OWNER};
alter default privileges in schema {schema} grant all on tables to {OWNER};
alter default privileges in schema {schema} grant all on sequences to {OWNER};
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


SCHEMAS = "select string_agg(nspname, ' ') from pg_namespace"


def layers_pushed(cluster: Cluster, supabase_db: str, tmp_path: Path,
                  instead: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The core and every layer pushed as migrations (a layer's text ``instead`` where given),
    after what the layers stand on (installed as a superuser, as Supabase's dashboard and
    pgflow's own migrations would; the owner, like Supabase's postgres role, may use every
    schema they made)."""
    before = set(cluster.psql(supabase_db, "-At", "-c", SCHEMAS).split())
    install.prerequisites(cluster, supabase_db, ["all"])
    for schema in sorted(set(cluster.psql(supabase_db, "-At", "-c", SCHEMAS).split()) - before):
        cluster.psql(supabase_db, "-c", for_owner(schema))
    instead = instead or {}
    return push(supabase_db, (ROOT / "sql/pgfence.sql").read_text(), tmp_path,
                *(instead.get(layer.name) or layer.bundle.read_text()
                  for layer in layers.discover()))


def test_supabase_db_push_locks_every_layer_down(cluster: Cluster, supabase_db: str,
                                                  tmp_path: Path) -> None:
    out = layers_pushed(cluster, supabase_db, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    registered = cluster.psql(supabase_db, "-At", "-c", "select count(*) from pgfence.layers")
    assert int(registered) == len(layers.names())
    assert cluster.psql(supabase_db, "-At", "-c", ANY_FOREIGN_PRIVILEGE).strip() == ""
    # As anon (a PostgREST request): nothing of a layer either.
    denied = subprocess.run(["psql", "-X", "-d", supabase_db, "-c", "set role anon",
                             "-c", "select pgfence_pgflow.complete_task(gen_random_uuid(), '{}')"],
                            capture_output=True, text=True)
    assert "permission denied" in denied.stderr


def test_negative_control_a_layer_without_its_lockdown_is_reachable(
        cluster: Cluster, supabase_db: str, tmp_path: Path) -> None:
    # The layer without the changes that lock it down: its lockdown and, from 0.3.0 on, the
    # release's seal (a fresh install runs a reworked change's script at its latest place, after
    # the lockdown change: what comes after that must not be cut off with it).
    sections = re.split(r"(?m)^(?=-- change: )", (ROOT / "sql/pgfence-pgmq.sql").read_text())
    layer = "".join(s for s in sections
                    if not s.startswith(("-- change: lockdown\n", "-- change: release_")))
    out = layers_pushed(cluster, supabase_db, tmp_path, {"pgmq": layer})
    assert out.returncode == 0, out.stdout + out.stderr
    seen = cluster.psql(supabase_db, "-At", "-c", ANY_FOREIGN_PRIVILEGE).strip()
    assert "anon: function pgfence_pgmq.read(" in seen and "pgfence_pgflow" not in seen


def test_pgtap_suite_passes_on_the_supabase_install(cluster: Cluster, supabase_db: str,
                                                     tmp_path: Path) -> None:
    # With Supabase Queues (pgmq, enabled from the dashboard as the extension) and pgfence's
    # pgmq layer as a second migration, whose pgTAP tests are in the suite.
    # On Supabase the postgres role, which runs migrations, may use pgmq's schema and its queue
    # tables (and owns the queues it creates): the same for the owner here, also for queues the
    # tests create later as a superuser.
    cluster.psql(supabase_db, "-c", "create extension pgmq", "-c", for_owner("pgmq"))
    out = push(supabase_db, (ROOT / "sql/pgfence.sql").read_text(), tmp_path,
               (ROOT / "sql/pgfence-pgmq.sql").read_text())
    assert out.returncode == 0, out.stdout + out.stderr
    cluster.psql(supabase_db, "-c", "create extension pgtap")
    install.helpers(cluster, supabase_db)
    # The core's suite and the pgmq layer's: the pgflow layer is not pushed here.
    files = [*sorted(str(p) for p in (ROOT / "pgtap").rglob("*.sql") if "helpers" not in p.parts),
             *map(str, layers.layer("pgmq").pgtap)]
    prove = subprocess.run(["pg_prove", "-d", supabase_db, *files], capture_output=True,
                           text=True, timeout=HUNG)
    assert prove.returncode == 0, prove.stdout[-3000:] + prove.stderr[-2000:]
    assert "All tests successful." in prove.stdout

"""The docs' examples run as written: README.md, guarantees.md, operations.md, pgmq.md, python.md,
supabase.md (its supabase-js code too), control-plane.md's setup, upgrading.md's adoption."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgfence.releases import Files
from pgfence.releases import key as release_key
from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database
from testkit.install import SQITCH_ENV
from tests.support import DENO, HUNG, ROOT
from tests.test_pgflow import two_steps

SERVICE_ROLE = """
do $$
begin
  if not exists (select from pg_roles where rolname = 'service_role') then
    create role service_role nologin;   -- Supabase's role of requests with the service key
  end if;
end
$$;
"""


def example(doc: str, marker: str, lang: str) -> str:
    text = (ROOT / doc).read_text()
    match = re.search(rf"<!-- {marker}[^>]*-->\s*```{lang}\n(.*?)```", text, flags=re.S)
    assert match, f"{doc} has no block marked {marker!r}"
    return match.group(1)


def run_psql(db: Database, script: str) -> None:
    dbname = db.one("select current_database()")
    out = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", dbname],
                         input=script, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_readme_example_runs_as_written(db: Database) -> None:
    run_psql(db, example("README.md", "README example", "sql"))
    # Both writes, each with the generation its fence returned.
    assert db.sql("select i.amount, i.generation = l.generation from invoices i, pgfence.leases l "
                  "order by i.id") == [(42, True), (7, True)]
    assert db.one("select status from pgfence.lease_status") == "released"


def test_guarantees_sql_worker_loop_runs_as_written(db: Database) -> None:
    run_psql(db, example("docs/guarantees.md", "guarantees SQL example", "sql"))
    assert db.sql("select state, result from pgfence.tasks") == [("completed", {"sent": True})]
    assert db.one("select status from pgfence.lease_status") == "released"
    assert db.one("select acknowledged_at is not null from pgfence.invocations")


def test_guarantees_python_worker_loop_works(db: Database) -> None:
    namespace: dict[str, Any] = {}
    exec(example("docs/guarantees.md", "guarantees Python example", "python"), namespace)
    db.sql("select pgfence.register('mailer')")
    for n in range(3):
        db.sql("select pgfence.enqueue('emails', %s)", (f'{{"n": {n}}}',))
    db.sql("select pgfence.enqueue('emails', '{\"n\": \"boom\"}', 1)")

    def handle(payload: dict[str, Any]) -> dict[str, Any]:
        if payload["n"] == "boom":
            raise ValueError("boom")
        return {"double": payload["n"] * 2}

    namespace["run_worker"](db.dsn, "mailer", "proc-1", "emails", handle)
    assert db.sql("select state, count(*) from pgfence.tasks group by state order by state") == [
        ("completed", 3), ("failed", 1)]
    assert db.one("select status from pgfence.lease_status") == "released"

    db.sql("create table invoices (amount int, generation bigint)")
    db.sql("select pgfence.protect('invoices', 'mailer')")
    with db.session("writer").conn as conn:
        lease_id = conn.execute("select lease_id from pgfence.acquire('mailer', 'w', '30 s')"
                                ).fetchone()[0]  # type: ignore[index]
        namespace["record_invoice"](conn, lease_id, 7)
    assert db.sql("select amount from invoices") == [(7,)]


def test_operations_procedure_runs_as_written(db: Database) -> None:
    run_psql(db, example("docs/operations.md", "operations example", "sql"))
    assert db.sql("select resource, enabled from pgfence.resources order by resource") == [
        ("billing", False), ("mailer", True)]
    assert db.sql("select outcome from pgfence.update_items order by resource") == [
        ("kept_disabled",), ("restored",)]


def test_pgmq_python_worker_loop_runs_as_written(mq: Database) -> None:
    mq.sql("select pgmq.create('jobs'); select pgfence.register('resize-worker')")
    mq.sql("select pgmq.send('jobs', jsonb_build_object('n', n)) from generate_series(1, 12) n")
    namespace: dict[str, Any] = {}
    exec(example("docs/pgmq.md", "pgmq Python example", "python"), namespace)
    seen: list[Any] = []
    namespace["work"](mq.dsn, seen.append)
    assert sorted(m["n"] for m in seen) == list(range(1, 13))
    assert mq.one("select count(*) from pgmq.a_jobs") == 12
    assert mq.one("select count(*) from pgmq.q_jobs") == 0
    assert mq.one("select status from pgfence.lease_status") == "released"


def test_python_client_examples_run(db: Database) -> None:
    """docs/python.md's worker, threaded and asyncio, each on the queue until it is idle."""
    db.sql("select pgfence.register('mailer')")
    for kind, marker in (("sync", "python example"), ("async", "python async example")):
        for n in range(2):
            db.sql("select pgfence.enqueue('emails', %s)", (f'{{"to": "{kind}-{n}@example.org"}}',))
        namespace: dict[str, Any] = {}
        exec(example("docs/python.md", marker, "python"), namespace)
        result = namespace["main"](db.dsn)
        if kind == "async":
            asyncio.run(result)
    rows = db.sql("select result->>'to', (result->>'task')::bigint = task_id "
                  "from pgfence.tasks order by task_id")
    assert rows == [(f"{k}-{n}@example.org", True) for k in ("sync", "async") for n in range(2)]
    assert db.sql("select status from pgfence.lease_status") == [("released",), ("released",)]



# TEST-ONLY: supabase-js's `supabase.schema(s).rpc(fn, args)` as PostgREST serves it (PostgREST
# does not run here): the arguments as a JSON body read by json_to_record with the function's
# own argument types, the call in its own transaction as `set local role service_role`, a
# composite result as an object (a NULL row: every field null, PostgREST/postgrest#3694), a
# scalar as itself, and an error as {code: SQLSTATE, message}.
POSTGREST_STAND_IN = r"""
import postgres from "postgres";
const sql = postgres(Deno.env.get("DATABASE_URL"), { max: 1, onnotice: () => {} });
const supabase = {
  schema: (schema) => ({
    rpc: async (fn, args) => {
      try {
        const data = await sql.begin(async (tx) => {
          await tx`set local role service_role`;
          const [f] = await tx`
            select p.proargnames as names,
                   array(select format_type(x, null) from unnest(p.proargtypes::oid[]) x) as types,
                   t.typtype = 'c' as composite
              from pg_proc p join pg_namespace n on n.oid = p.pronamespace
              join pg_type t on t.oid = p.prorettype
             where n.nspname = ${schema} and p.proname = ${fn}`;
          const keys = Object.keys(args);
          const cols = keys.map((k) => `${k} ${f.types[f.names.indexOf(k)]}`).join(", ");
          const call = `${schema}.${fn}(${keys.map((k) => `${k} => _a.${k}`).join(", ")})`;
          const from = `from json_to_record($1::text::json) as _a(${cols})`;
          const [row] = await tx.unsafe(f.composite
            ? `select row_to_json(r) as data ${from}, ${call} r`
            : `select to_json(${call}) as data ${from}`, [JSON.stringify(args)]);
          return row.data;
        });
        return { data, error: null };
      } catch (e) {
        return { data: null, error: { code: e.code, message: e.message } };
      }
    },
  }),
};
"""

SUPABASE_JS_SCENARIO = """
const said = [await recordInvoice(supabase, 42)];
await sql`select pgfence.acquire('billing', 'another-owner', '1 hour')`;
said.push(await recordInvoice(supabase, 7));
console.log(JSON.stringify(said));
await sql.end();
"""


@pytest.mark.parametrize("branch", [True, False], ids=["as written", "negative control"])
def test_supabase_js_example_runs_as_written(db: Database, tmp_path: Path,
                                             deno_env: dict[str, str], branch: bool) -> None:
    """The edge function's code, as written, against a stand-in for PostgREST: the first call
    writes under its own lease and releases it; the second, while another owner holds the
    lease, writes nothing and says so (null). The negative control is the same code without
    its branch for a lease someone else holds: it passes the null lease id on and fails."""
    db.sql(SERVICE_ROLE)
    run_psql(db, example("docs/supabase.md", "supabase RPC example", "sql"))
    code = example("docs/supabase.md", "supabase-js example", "ts")
    if not branch:
        code, n = re.subn(r"\n\s*if \(lease\.lease_id === null\) return null;", "", code)
        assert n == 1
    (tmp_path / "node_modules").symlink_to(ROOT / ".tools/node_modules")
    (tmp_path / "package.json").write_text("{}")
    (tmp_path / "example.js").write_text(POSTGREST_STAND_IN + code + SUPABASE_JS_SCENARIO)
    dbname = db.one("select current_database()")
    out = subprocess.run([str(DENO), "run", "--allow-net", "--allow-env", "--allow-read",
                          "--allow-sys", "example.js"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=HUNG,
                         env={**deno_env, "DATABASE_URL": f"postgresql://postgres@127.0.0.1:"
                                                          f"{os.environ['PGPORT']}/{dbname}"})
    if not branch:
        assert out.returncode != 0 and "lease_id" in out.stderr, out.stdout + out.stderr
        return
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout) == [1, None]
    assert db.sql("select amount, generation from app.invoices") == [(42, 1)]
    assert db.sql("select owner, status from pgfence.lease_status order by generation") == [
        ("edge-1", "released"), ("another-owner", "current")]


def test_pgmq_sql_worker_loop_runs_as_written(mq: Database) -> None:
    run_psql(mq, example("docs/pgmq.md", "pgmq SQL example", "sql"))
    assert mq.one("select count(*) from pgmq.a_jobs") == 5
    assert mq.one("select count(*) from pgmq.q_jobs") == 0
    assert mq.sql("select outcome, count(*) from pgfence_pgmq.reads group by outcome") == [
        ("archive", 5)]
    assert mq.one("select status from pgfence.lease_status") == "released"


@pytest.fixture
def empty_database(cluster: Cluster) -> Iterator[str]:
    name = f"docs_{uuid.uuid4().hex[:10]}"
    cluster.create_database(name)
    yield name
    cluster.drop_database(name)


def shell_lines(doc: str, marker: str) -> str:
    return example(doc, marker, "sh")


@pytest.mark.parametrize("doc,marker", [("README.md", "one-file install"),
                                        ("docs/pgmq.md", "pgmq install")])
def test_one_file_install_lines_run_as_written_and_quietly(
        cluster: Cluster, empty_database: str, doc: str, marker: str) -> None:
    if doc == "docs/pgmq.md":
        cluster.psql(empty_database, "-c", "create extension pgmq")
    url = f"postgresql://postgres@127.0.0.1:{cluster.port}/{empty_database}"
    out = subprocess.run(["bash", "-e", "-c", shell_lines(doc, marker)], cwd=ROOT,
                         capture_output=True, text=True, timeout=HUNG,
                         env={**os.environ, "DATABASE_URL": url})
    assert out.returncode == 0, out.stderr
    # -q: no command tag per statement, and no query result (each release's seal is a DO
    # block): nothing at all.
    assert out.stdout.strip() == "", out.stdout
    assert cluster.psql(empty_database, "-At", "-c", "select pgfence.version()").strip() == \
        Files().newest()
    if doc == "docs/pgmq.md":
        assert cluster.psql(empty_database, "-At", "-c", "select to_regnamespace("
                            "'pgfence_pgmq') is not null").strip() == "t"


def test_control_plane_setup_runs_as_written(tmp_path: Path) -> None:
    """docs/control-plane.md's setup, its lines up to `--init`, in one shell from the
    repository: a cluster of its own, pgfence, the example's tables; then that cluster is
    asked what the lines made, and removed. (Its replicas and their failover are
    tests/test_control_plane.py's.)"""
    lines = example("docs/control-plane.md", "control-plane setup", "sh").splitlines()
    setup = lines[:next(i for i, line in enumerate(lines) if "--init" in line) + 1]
    assert setup[0].startswith('eval "$(scripts/pg up)"')
    script = "\n".join(["set -e", setup[0], "trap 'scripts/pg down' EXIT", *setup[1:],
                        "psql -X -qAt -d cp -c 'select pgfence.version()' "
                        "-c \"select resource from pgfence.resources\" "
                        "-c \"select count(*) from pgfence.protected_tables where healthy\""])
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=HUNG, env={k: v for k, v in os.environ.items()
                                            if not k.startswith("PG")})
    assert out.returncode == 0, out.stdout + out.stderr
    *_, version, resource, protected = out.stdout.split("\n")[:-1]
    assert version == Files().newest() and resource == "control-plane"
    assert int(protected) >= 1


def test_adoption_by_sqitch_runs_as_written(cluster: Cluster, empty_database: str) -> None:
    """docs/upgrading.md's adoption, for the newest release and its layers, on a database the
    release's one-file installs made (pgfence, both layers, after pgmq and pgflow), then the
    upgrade by Sqitch: afterwards Sqitch has nothing to deploy for any of the three projects,
    and its verify scripts passed on the way."""
    name = empty_database
    release = max(Files().releases(), key=release_key)
    install.prerequisites(cluster, name, ["pgflow"])
    for file in (f"pgfence--{release}.sql", f"pgfence-pgmq--{release}.sql",
                 f"pgfence-pgflow--{release}.sql"):
        cluster.psql(name, "--single-transaction", "-f", ROOT / "sql/releases" / file)

    def up_to_date(project: str) -> bool:
        status = subprocess.run(["sqitch", "status", f"db:pg:{name}"],
                                cwd=ROOT / "layers" / project if project else ROOT,
                                capture_output=True, text=True, timeout=HUNG,
                                env={**os.environ, **SQITCH_ENV})
        return "Nothing to deploy (up-to-date)" in status.stdout

    assert not up_to_date("pgflow")             # the negative control: before the lines
    lines = example("docs/upgrading.md", "adoption", "sh")
    assert f"--to @v{release} " in lines, "the adoption lines name an old release"
    out = subprocess.run(["bash", "-e", "-c", lines.replace("mydb", name)], cwd=ROOT,
                         capture_output=True, text=True, timeout=HUNG,
                         env={**os.environ, **SQITCH_ENV})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == release
    assert all(up_to_date(project) for project in ("", "pgmq", "pgflow"))
    assert cluster.psql(name, "-At", "-c", "select pgfence.version()").strip() == \
        Files().newest()


def test_pgflow_rollout_block_runs_as_written(flow: Database) -> None:
    """docs/pgflow.md's rollout: both tables of flow `two` protected in observe, on pgflow
    0.8.1 and 0.14.1 (the flow fixture's)."""
    two_steps(flow, resources=("my-flow-worker", "other-flow-worker"))
    flow.sql(textwrap.dedent(example("docs/pgflow.md", "pgflow rollout", "sql")))
    assert flow.sql("select table_name::text, mode, resources from pgfence.protected_tables "
                    "order by 1") == [
        ("pgflow.step_tasks", "observe", ["my-flow-worker", "other-flow-worker"]),
        ("pgmq.q_two", "observe", ["my-flow-worker"])]

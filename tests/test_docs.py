"""The examples in README.md and docs/guarantees.md run as written."""

from __future__ import annotations

import asyncio
import re
import subprocess
import textwrap
from typing import Any

from testkit.harness import Database
from tests.support import ROOT
from tests.test_pgflow import two_steps


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



def test_pgflow_rollout_block_runs_as_written(flow: Database) -> None:
    """docs/pgflow.md's rollout: both tables of flow `two` protected in observe, on pgflow
    0.8.1 and 0.14.1 (the flow fixture's)."""
    two_steps(flow, resources=("my-flow-worker", "other-flow-worker"))
    flow.sql(textwrap.dedent(example("docs/pgflow.md", "pgflow rollout", "sql")))
    assert flow.sql("select table_name::text, mode, resources from pgfence.protected_tables "
                    "order by 1") == [
        ("pgflow.step_tasks", "observe", ["my-flow-worker", "other-flow-worker"]),
        ("pgmq.q_two", "observe", ["my-flow-worker"])]

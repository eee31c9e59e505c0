"""pgflow 0.14.1 (its published migrations, tests/pgflow14.py) on a cluster with the real
pg_cron and test-only stand-ins for pg_net and Vault: pgflow's own worker registration works
here as it does on Supabase, so that the pgflow layer's integration with it can be tested.

Skipped, saying why, where ../shared/vendor/pgflow-core-0.14.1 or pg_cron is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.harness import Database
from tests.pgflow14 import CRON_DATABASE, cron_cluster, install_pgflow14

PROJECT = "testproj"
URL = f"https://{PROJECT}.supabase.co/functions/v1/my-fn"


@pytest.fixture(scope="module")
def cluster14() -> Iterator[Cluster]:
    with cron_cluster() as c:
        yield c


@pytest.fixture
def flow14(cluster14: Cluster, tmp_path: Path) -> Iterator[Database]:
    """A fresh cron database with pgflow 0.14.1, its cron jobs as its migrations scheduled
    them, and the Vault secrets ensure_workers() reads."""
    cluster14.drop_database(CRON_DATABASE)
    cluster14.create_database(CRON_DATABASE)
    install_pgflow14(cluster14, CRON_DATABASE, tmp_path)
    db = Database(cluster14.dsn(CRON_DATABASE))
    db.sql("insert into vault.decrypted_secrets values ('supabase_project_id', %s), "
           "('pgflow_auth_secret', 's3cret')", (PROJECT,))
    try:
        yield db
    finally:
        db.close()
        cluster14.drop_database(CRON_DATABASE)


def pings(db: Database) -> list[tuple[str, str]]:
    return [(url, auth) for url, auth in db.sql(
        "select url, headers->>'Authorization' from net.stand_in_calls order by id")]


def run_job(db: Database, name: str) -> None:
    """What pg_cron's scheduler runs for job ``name``: its command, as it is scheduled."""
    db.sql(str(db.one("select command from cron.job where jobname = %s", (name,))))


def test_pgflow_014_registers_and_pings_its_workers_through_pg_cron(flow14: Database) -> None:
    db = flow14
    assert db.one("select extversion from pg_extension where extname = 'pg_cron'")
    assert {name: command for name, command in db.sql(
        "select jobname, command from cron.job where active")} == {
        "pgflow_cleanup_logs": "select pgflow.cleanup_ensure_workers_logs()",
        "pgflow_ensure_workers": "select pgflow.ensure_workers()",
        "pgflow_requeue_stalled_tasks": "select pgflow.requeue_stalled_tasks()"}
    db.sql("update cron.job set active = false")  # the test runs the jobs, step by step
    # A worker registers its function on startup; the ensure-workers job pings a function
    # with no live worker through pg_net, with the secret from Vault.
    db.sql("select pgflow.track_worker_function('my-fn')")
    run_job(db, "pgflow_ensure_workers")
    assert pings(db) == [(URL, "Bearer s3cret")]
    # Debounce: pinged within the last 6 s, not again.
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name, invoked from pgflow.ensure_workers()") == [
        ("my-fn", True)]
    # A live worker (a recent heartbeat) keeps its function from being pinged ...
    worker = db.one("insert into pgflow.workers (worker_id, queue_name, function_name) "
                    "values (gen_random_uuid(), 'q', 'my-fn') returning worker_id")
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name from pgflow.ensure_workers()") == []
    # ... until it says it stopped (pgflow's own call, on the worker's beforeunload).
    db.sql("select pgflow.mark_worker_stopped(%s)", (worker,))
    assert db.sql("select function_name from pgflow.ensure_workers()") == [("my-fn",)]
    # A disabled function is never pinged.
    db.sql("update pgflow.worker_functions set enabled = false, "
           "last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name from pgflow.ensure_workers()") == []
    assert len(pings(db)) == 3
    run_job(db, "pgflow_requeue_stalled_tasks")   # pgflow's own maintenance runs here too
    run_job(db, "pgflow_cleanup_logs")

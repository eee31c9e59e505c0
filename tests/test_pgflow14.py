"""pgflow 0.14.1 (its published migrations, tests/pgflow14.py) on a cluster with the real
pg_cron and test-only stand-ins for pg_net and Vault: pgflow's own worker registration works
here as it does on Supabase, so that the pgflow layer's integration with it can be tested.

Skipped, saying why, where ../shared/vendor/pgflow-core-0.14.1 or pg_cron is absent. Only what
0.14.1 alone has is here; the layer's protocol, its requeue_stalled_tasks and its worker rows
are tested on 0.8.1 and 0.14.1 alike in tests/test_pgflow*.py (the fixture pgflow_version).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database, sqlstate
from tests.pgflow14 import CRON_DATABASE, install_pgflow14
from tests.support import acquired
from tests.test_pgflow import complete, run_status, two_steps
from tests.test_pgflow_runs import shift_message, start

PROJECT = "testproj"
URL = f"https://{PROJECT}.supabase.co/functions/v1/my-fn"


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


# -- the pgflow layer on pgflow 0.14.1 --------------------------------------------------------

@pytest.fixture
def fenced14(flow14: Database, cluster14: Cluster) -> Database:
    """flow14 with pgfence, its pgmq and pgflow layers and the test helpers installed after
    pgflow 0.14.1, the cron jobs pointed at the layer (pgfence_pgflow.setup_cron), and paused:
    the tests run the jobs' commands themselves."""
    install.install(cluster14, CRON_DATABASE, ["pgflow"], with_prerequisites=False,
                    with_helpers=True)
    assert flow14.one("select pgfence_pgflow.setup_cron()") == \
        "2 pgflow cron jobs now call pgfence_pgflow"
    flow14.sql("update cron.job set active = false")
    return flow14


def test_the_layer_fences_pgflow_014s_protocol(fenced14: Database) -> None:
    db = fenced14
    run_id = two_steps(db)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("fn"))
    [(attempt, step)] = start(a, la)
    assert step == "first"
    # Hidden for the step's timeout + 2 s, counted from the read in the same statement (from a
    # later one, however slow the machine was in between came off it).
    assert db.one("select vt - last_read_at > interval '61 seconds' from pgmq.q_two") is True
    db.expire(la)
    lb = acquired(b.acquire("fn"))
    assert sqlstate(lambda: start(a, la)) == "PF001"
    shift_message(db, "two", 63)
    [(fresh, _)] = start(b, lb)
    assert complete(a, attempt, '{"by": "a"}') == "stale"
    assert complete(b, fresh, '{"by": "b"}') == "accepted"
    [(second, _)] = start(b, lb)
    assert complete(b, second, '{"by": "b"}') == "accepted"
    assert run_status(db, run_id)[0] == "completed"


def function_with_worker(db: Database) -> None:
    db.sql("select pgfence.register('my-fn')")
    db.sql("select pgflow.track_worker_function('my-fn')")


def enabled(db: Database) -> tuple[bool, bool]:
    """(pgfence's resource, pgflow's worker function)."""
    row = db.sql("select r.enabled, wf.enabled from pgfence.resources r "
                 "join pgflow.worker_functions wf on wf.function_name = r.resource "
                 "where r.resource = 'my-fn'")
    return bool(row[0][0]), bool(row[0][1])


def test_worker_functions_follow_resources_through_an_update_window(fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    assert enabled(db) == (True, True)
    token = db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    assert enabled(db) == (False, False), "the window disables the function too"
    db.sql("select pgflow.track_worker_function('my-fn')")            # a worker starts
    db.sql("update pgflow.worker_functions set enabled = true")       # or someone by hand
    assert enabled(db) == (False, False), "nothing enables it past pgfence (I6)"
    db.sql("update pgflow.worker_functions set last_invoked_at = null")
    assert db.sql("select * from pgfence_pgflow.ensure_workers()") == []
    assert db.sql("select * from pgfence.finish_update(%s)", (token,)) == [
        ("my-fn", True, "restored")]
    assert enabled(db) == (True, True), "restored exactly"
    db.sql("select pgfence.set_enabled('my-fn', false)")
    token = db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert enabled(db) == (False, False), "a function disabled before the window stays so"


def test_negative_control_without_following_the_window_leaves_the_function_pinged(
        fenced14: Database) -> None:
    db = fenced14
    db.sql("drop trigger pgfence_pgflow_worker_functions on pgfence.resources")
    function_with_worker(db)
    db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    assert enabled(db) == (False, True)
    db.sql("select * from pgflow.ensure_workers()")
    assert len(pings(db)) == 1, "pgflow pings the function in the middle of the window"


def invocations_sent(db: Database) -> list[str]:
    return [str(i) for (i,) in db.sql("select body->>'invocation_id' from net.stand_in_calls "
                                      "order by id")]


def due(db: Database) -> None:
    """The function's debounce has passed."""
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")


def test_ensure_workers_starts_a_function_only_through_the_handshake(fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    run_job(db, "pgflow_ensure_workers")                              # the cron job, repointed
    [sent] = invocations_sent(db)
    assert pings(db) == [(URL, "Bearer s3cret")]
    assert db.one("select count(*) from pgfence.invocations where invocation_id = %s "
                  "and acknowledged_at is null", (sent,)) == 1, "a pending invocation"
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1, "not again while the invocation is pending"
    # The function acquires with the id it was sent (the handshake) and works ...
    w = db.session("edge")
    lease = acquired(w.acquire("my-fn", invocation_id=uuid.UUID(sent)))
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1, "not while its lease is current"
    # ... until it releases: then a fresh request, with a new id.
    w.release(lease)
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(invocations_sent(db)) == 2 and invocations_sent(db)[1] != sent


def test_negative_control_pgflows_own_ensure_workers_pings_without_an_invocation(
        fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    w = db.session("edge")
    acquired(w.acquire("my-fn"))                                      # a worker is current
    db.sql("select * from pgflow.ensure_workers()")
    assert invocations_sent(db) == ["None"], "pinged, with no invocation, while one is current"


def test_workers_of_ended_leases_are_deprecated_or_stopped(fenced14: Database) -> None:
    db = fenced14
    two_steps(db)
    db.sql("select pgflow.start_flow('two', '{}')")
    db.sql("select pgflow.track_worker_function('fn')")
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("fn", owner="a"))
    start(a, la, qty=1)
    db.expire(la)
    lb = acquired(b.acquire("fn", owner="b"))                         # a superseded
    start(b, lb, qty=1)
    b.release(lb)
    db.sql("select pgfence_pgflow.sync_workers()")
    assert db.sql("select deprecated_at is not null, stopped_at is not null from pgflow.workers "
                  "order by started_at") == [(True, False), (False, True)]
    # pgflow sees no live worker: the next ensure asks for a start.
    due(db)
    assert [f for f, _, _ in db.sql("select * from pgfence_pgflow.ensure_workers()")] == ["fn"]

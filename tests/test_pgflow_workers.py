"""pgflow's worker rows under the pgflow layer (npm @pgflow/core 0.8.1 and 0.14.1, the fixture
pgflow_version): one pgflow.workers row per worker (its resource and owner name), not per
lease; the rows of ended leases marked deprecated; pgflow's worker pruning under `enforce`, and
pgfence.prune deleting the ended rows, never a live worker's. Each with its negative control.
(pgflow 0.14's registration: tests/test_pgflow14.py.)
"""

from __future__ import annotations

import pytest

from testkit.harness import Database, sqlstate
from tests.support import acquired
from tests.test_pgflow import START, complete, protect, two_steps
from tests.test_pgflow_runs import start


def three_terms(db: Database) -> list[tuple[str, bool]]:
    """Worker `w` holds three leases one after the other (a supervised worker re-acquiring),
    starting a task in each, and `v` one: (function_name, deprecated) of each worker row."""
    two_steps(db)
    for n in (2, 3, 4):
        db.sql("select pgflow.start_flow('two', %s::jsonb)", (f'{{"n": {n}}}',))
    w = db.session("w")
    for _ in range(2):
        lease = acquired(w.acquire("fn", owner="w"))
        start(w, lease, qty=1)
        w.release(lease)
    lease = acquired(w.acquire("fn", owner="w"))
    start(w, lease, qty=1)
    w.drain(lease)
    v = db.session("v")
    start(v, acquired(v.acquire("fn", owner="v")), qty=1)
    db.sql("select pgfence_pgflow.sync_workers()")
    return [(str(f), bool(d)) for f, d in db.sql(
        "select function_name, deprecated_at is not null from pgflow.workers "
        "order by started_at")]


def test_one_worker_row_per_worker_not_per_lease(flow: Database) -> None:
    assert three_terms(flow) == [("fn", True), ("fn", False)], \
        "w's row, reused by its three leases, deprecated as its last lease drained; v's live"


def test_negative_control_a_row_per_lease_piles_up(flow: Database) -> None:
    flow.install_mutant("pgflow-worker-per-lease")
    assert len(three_terms(flow)) == 4


def test_a_worker_that_acquires_again_is_live_again(flow: Database) -> None:
    two_steps(flow)
    w, v = flow.session("w"), flow.session("v")
    lw = acquired(w.acquire("fn", owner="w"))
    start(w, lw, qty=1)
    flow.expire(lw)
    lv = acquired(v.acquire("fn", owner="v"))        # w's lease superseded
    flow.sql("select pgfence_pgflow.sync_workers()")
    assert flow.one("select deprecated_at is not null from pgflow.workers") is True
    flow.expire(lv)
    flow.sql("select pgflow.start_flow('two', '{}')")
    start(w, acquired(w.acquire("fn", owner="w")), qty=1)
    assert flow.sql("select deprecated_at is null from pgflow.workers where worker_id in "
                    "(select last_worker_id from pgflow.step_tasks)") == [(True,)]


def test_pgflows_worker_pruning_works_under_enforce(flow: Database) -> None:
    two_steps(flow)
    w = flow.session("w")
    lease = acquired(w.acquire("fn"))
    [(attempt, _)] = start(w, lease, qty=1)
    assert complete(w, attempt, "{}") == "accepted"
    w.release(lease)
    protect(flow, "enforce")
    flow.sql("update pgflow.workers set last_heartbeat_at = now() - interval '8 days'")
    # The row is a completed task's last_worker_id: deleting it sets that to NULL, an update
    # of step_tasks, which the guard refuses without a fence ...
    assert sqlstate(lambda: flow.sql("delete from pgflow.workers")) == "PF007"
    # ... and the layer's pruning of worker rows is let through.
    assert flow.sql("select * from pgfence_pgflow.prune_workers('7 days')") == [
        ("pgflow.workers", 1)]
    assert flow.one("select count(*) from pgflow.workers") == 0
    assert flow.one("select last_worker_id from pgflow.step_tasks where step_slug = 'first'") \
        is None


def test_the_layers_pruning_keeps_a_worker_with_a_task_in_hand(flow: Database) -> None:
    two_steps(flow)
    w = flow.session("w")
    start(w, acquired(w.acquire("fn")), qty=1)
    flow.sql("update pgflow.workers set last_heartbeat_at = now() - interval '8 days'")
    assert flow.sql("select rows from pgfence_pgflow.prune_workers('7 days')") == [(0,)]


def test_start_is_unchanged_by_the_worker_row(flow: Database) -> None:
    """The start's definition names the worker once (a sanity check of the mutants' texts)."""
    src = str(flow.one("select pg_get_functiondef(%s::regprocedure)", (START,)))
    assert src.count("pgfence.owner_ref(") == 1


def idle_and_ended(db: Database) -> None:
    """Worker `w` finished its task and released its lease; `v` finished its task and is still
    live (its lease active), idle since. Both rows' heartbeats are older than the bound: `v`'s
    is as old as its last start."""
    two_steps(db)
    db.sql("select pgflow.start_flow('two', '{\"n\": 2}')")
    w, v = db.session("w"), db.session("v")
    lw = acquired(w.acquire("fn", owner="w"))
    [(attempt, _)] = start(w, lw, qty=1)
    assert complete(w, attempt, "{}") == "accepted"
    w.release(lw)
    lv = acquired(v.acquire("fn", owner="v"))
    [(attempt, _)] = start(v, lv, qty=1)
    assert complete(v, attempt, "{}") == "accepted"
    db.sql("update pgflow.workers set last_heartbeat_at = now() - interval '8 days'")


def worker_rows(db: Database) -> list[tuple[str, str | None]]:
    return [(str(r[0]), None if r[1] is None else str(r[1])) for r in db.sql(
        "select w.function_name, l.owner from pgflow.workers w "
        "left join pgfence_pgflow.worker_leases wl using (worker_id) "
        "left join pgfence.leases l using (lease_id) order by l.owner")]


def test_pgfence_prune_deletes_ended_worker_rows_never_a_live_workers(flow: Database) -> None:
    idle_and_ended(flow)
    protect(flow, "enforce")
    rows = dict(flow.sql("select what, rows from pgfence.prune('7 days')"))
    assert rows["pgflow.workers"] == 1, "w's row: its lease released, no heartbeat for 8 days"
    assert worker_rows(flow) == [("fn", "v")], "v's row stays: its lease is live, though idle"
    # The released worker's tasks keep their results; their last_worker_id is gone with it.
    assert flow.one("select count(*) from pgflow.step_tasks where status = 'completed'") == 2
    assert flow.one("select count(*) from pgflow.step_tasks where status = 'completed' "
                    "and last_worker_id is null") == 1


def test_pgfence_prune_keeps_worker_rows_within_the_bound(flow: Database) -> None:
    idle_and_ended(flow)
    flow.sql("update pgflow.workers set last_heartbeat_at = now() - interval '6 days'")
    assert dict(flow.sql("select what, rows from pgfence.prune('7 days')"))["pgflow.workers"] == 0
    assert len(worker_rows(flow)) == 2


def test_negative_control_pruning_a_live_idle_workers_row(flow: Database) -> None:
    flow.install_mutant("pgflow-prune-live-worker-row")
    idle_and_ended(flow)
    assert dict(flow.sql("select what, rows from pgfence.prune('7 days')"))["pgflow.workers"] == 2


def test_requeue_stalled_tasks_under_enforce_never_starts_a_task_twice(
        flow: Database, pgflow_version: str) -> None:
    """A start whose worker went silent (its lease expired) past its step's timeout, its
    message still hidden (its visibility extended): the layer's recovery gives the message back
    at once, under enforce, on 0.8.1 (which has no recovery of its own) and 0.14.1 alike
    (whose own requeue_stalled_tasks the guards refuse); the next read takes the task over,
    once, and the stalled attempt's result is stale and stays so."""
    two_steps(flow)
    a = flow.session("a")
    la = acquired(a.acquire("fn"))
    [(stale, _)] = start(a, la)
    # Past the step's timeout (60 s) since its start, its message hidden for an hour more.
    flow.sql("update pgflow.step_tasks set started_at = started_at - interval '61 seconds', "
             "queued_at = queued_at - interval '61 seconds' where step_slug = 'first'")
    flow.sql("update pgmq.q_two set vt = clock_timestamp() + interval '1 hour'")
    flow.expire(la)
    protect(flow, "enforce")
    if pgflow_version == "0.14.1":
        assert sqlstate(lambda: flow.sql("select pgflow.requeue_stalled_tasks()")) == "PF007", \
            "pgflow's own job is refused under enforce"
    assert flow.one("select pgfence_pgflow.requeue_stalled_tasks()") == 1
    assert flow.one("select vt <= clock_timestamp() from pgmq.q_two") is True, "visible again"
    b = flow.session("b")
    lb = acquired(b.acquire("fn"))
    [(fresh, _)] = start(b, lb)
    assert flow.one("select attempts_count from pgflow.step_tasks where step_slug = 'first'") == 2
    assert start(b, lb) == [], "started once"
    assert complete(a, stale, '{"by": "a"}') == "stale"
    assert complete(b, fresh, '{"by": "b"}') == "accepted"
    assert complete(a, stale, '{"by": "a"}') == "stale", "and stays stale"


# -- names that collide or steer (issue 40) ---------------------------------------------------

def slashed_names(db: Database) -> int:
    """Resource `a/b` with owner `c`, and resource `a` with owner `b/c`, each start a task of its
    own flow: how many pgflow.workers rows they have."""
    for flow in ("f1", "f2"):
        db.sql("select pgflow.create_flow(%s)", (flow,))
        db.sql("select pgflow.add_step(%s, 'only')", (flow,))
        db.sql("select pgflow.start_flow(%s, '{}')", (flow,))
    for resource, owner, flow in (("a/b", "c", "f1"), ("a", "b/c", "f2")):
        db.sql("select pgfence.register(%s)", (resource,))
        s = db.session(owner)
        lease = acquired(s.acquire(resource, owner=owner))
        s.run("select * from pgfence_pgflow.start_tasks(%s, %s, %s, '1 hour', 1)",
              (lease.lease_id, flow, flow))
    return int(db.one("select count(*) from pgflow.workers"))


def test_resource_and_owner_names_never_meet_in_one_worker_row(flow: Database) -> None:
    assert slashed_names(flow) == 2


def test_negative_control_a_worker_id_of_joined_names_is_shared(flow: Database) -> None:
    flow.install_mutant("owner-ref-joined-names")
    assert slashed_names(flow) == 1, "two workers share one row"


def restarted(db: Database) -> bool:
    """Worker `w` starts a task, releases its lease (its row stopped), acquires again and
    starts the next: whether its row is still marked stopped."""
    two_steps(db)
    db.sql("select pgflow.start_flow('two', '{\"n\": 2}')")
    w = db.session("w")
    lease = acquired(w.acquire("fn", owner="w"))
    start(w, lease, qty=1)
    w.release(lease)
    db.sql("select pgfence_pgflow.sync_workers()")
    assert db.one("select stopped_at is not null from pgflow.workers") is True
    start(w, acquired(w.acquire("fn", owner="w")), qty=1)
    return bool(db.one("select stopped_at is not null from pgflow.workers"))


def test_a_worker_that_starts_again_is_no_longer_stopped(flow: Database,
                                                         pgflow_version: str) -> None:
    if pgflow_version == "0.8.1":
        pytest.skip("pgflow 0.8.1's workers have no stopped_at")
    assert restarted(flow) is False


def test_negative_control_a_restart_that_keeps_stopped_at(flow: Database,
                                                          pgflow_version: str) -> None:
    if pgflow_version == "0.8.1":
        pytest.skip("pgflow 0.8.1's workers have no stopped_at")
    flow.install_mutant("pgflow-restart-keeps-stopped")
    assert restarted(flow) is True

"""No session can wedge a resource by holding its row.

acquire locks the resource row, so a worker that acquires inside a transaction and then idles
(or prepares the transaction) would keep the row locked. Pollers (acquire without an
invocation, request_start) give up on a locked row at once and answer NULL, as for a resource
that is held; paths that must wait (an operator's, a worker started for an invocation) wait at
most lock_timeout, 5 seconds when the caller set none, and then raise 55P03 naming who holds
the row. A layer's result (pgflow's complete and fail, pgmq's archive and delete, set_vt)
waits for its run or its message at most 5 s too, then 55P03, which both clients send again.
Each with a negative control.
"""

from __future__ import annotations

import psycopg
import pytest

from testkit.harness import HANG, Database, Session


def wedged(db: Database) -> Session:
    """Session `w` acquired r inside a transaction and went idle, holding r's row."""
    db.sql("select pgfence.register('r')")
    w = db.session("w")
    w.begin()
    w.acquire("r")
    w.hold_open()    # to hold the row for as long as a test needs
    return w


@pytest.mark.parametrize("poll", [
    "select (pgfence.acquire('r', 'p', '30 s')).lease_id",
    "select pgfence.request_start('r')",
], ids=["acquire", "request_start"])
def test_pollers_do_not_queue_behind_a_wedged_row(any_db: Database, poll: str) -> None:
    w = wedged(any_db)
    step = any_db.session("p").start(poll)
    assert step.settle() is False, "the poller waits for the idle session"
    assert step.one() is None
    w.rollback()


@pytest.mark.parametrize(("mutant", "poll"), [
    ("acquire-poller-waits", "select (pgfence.acquire('r', 'p', '30 s')).lease_id"),
    ("request-start-waits", "select pgfence.request_start('r')"),
], ids=["acquire", "request_start"])
def test_negative_control_a_waiting_poller_is_wedged(db: Database, mutant: str,
                                                     poll: str) -> None:
    db.install_mutant(mutant)
    w = wedged(db)
    step = db.session("p").start(poll)
    assert step.settle() is True and step.blocked_by == [w.pid]
    w.rollback()
    step.result()


@pytest.mark.parametrize("call", [
    "select pgfence.set_enabled('r', false)",
    "select pgfence.deprecate('r')",
    "select pgfence.cancel_invocations('r')",
    "select pgfence.prepare_update(array['r'], gen_random_uuid())",
    "select pgfence.acquire('r', 'started', '30 s', pgfence.request_start('r'))",
], ids=["set_enabled", "deprecate", "cancel_invocations", "prepare_update", "acquire_invocation"])
def test_waiting_paths_give_up_and_name_the_holder(db: Database, call: str) -> None:
    if "request_start" in call:  # an invocation first, before the row is wedged
        db.sql("select pgfence.register('r')")
        invocation = db.one("select pgfence.request_start('r')")
        call = call.replace("pgfence.request_start('r')", f"'{invocation}'::uuid")
    w = wedged(db)
    op = db.session("op")
    op.run("set lock_timeout = '200ms'")
    with pytest.raises(psycopg.Error) as refused:
        op.run(call)
    assert refused.value.sqlstate == "55P03"
    detail = refused.value.diag.message_detail or ""
    assert f"r: pid {w.pid} (w, idle in transaction since" in detail, detail
    w.rollback()
    op.run(call)  # and once the holder is gone, it goes through


def test_without_a_lock_timeout_the_wait_is_bounded(db: Database) -> None:
    w = wedged(db)
    step = db.session("op").start("select pgfence.set_enabled('r', false)")
    assert step.settle() is True and step.blocked_by == [w.pid]
    with pytest.raises(psycopg.Error) as refused:
        step.result(timeout=20)
    assert refused.value.sqlstate == "55P03"
    assert "gave up after lock_timeout 5s" in str(refused.value)
    w.rollback()


def test_negative_control_an_unbounded_wait_outlasts_the_bound(db: Database) -> None:
    db.install_mutant("lock-resources-unbounded")
    w = wedged(db)
    step = db.session("op").start("select pgfence.set_enabled('r', false)")
    assert step.settle() is True
    # Still waiting well past the bound: only the holder's end lets it through.
    db.wait_until("select clock_timestamp() > %s + interval '6 seconds'",
                  (db.one("select now()"),))
    assert step.settle() is True, "the operator gave up although nothing bounds its wait"
    w.rollback()
    assert step.one() is True


# -- a layer's result waits for its run or its message a bounded time (issue 40) ---------------

def started(db: Database) -> tuple[Session, object, object]:
    """Flow `two`, its first task started by `w`: (w, the attempt, the run)."""
    db.sql("select pgflow.create_flow('two')")
    db.sql("select pgflow.add_step('two', 'first')")
    db.sql("select pgfence.register('fn')")
    run = db.one("select run_id from pgflow.start_flow('two', '{}')")
    w = db.session("w")
    lease = w.acquire("fn")
    assert lease is not None
    attempt = w.one("select attempt_id from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                    "'1 hour', 1)", (lease.lease_id,))
    return w, attempt, run


def run_held(db: Database, run: object) -> Session:
    """Session `h` holds the run's row, as another result of the run would, and idles."""
    h = db.session("h")
    h.begin()
    h.run("select from pgflow.runs where run_id = %s for update", (run,))
    h.hold_open()
    return h


# A result alone, and a batch's (which locks the batch's runs first).
RESULTS = {"complete_task": "select pgfence_pgflow.complete_task(%s, '{}')",
           "complete_many": "select outcome from pgfence_pgflow.complete_many(array[%s]::uuid[])"}


@pytest.mark.parametrize("result", list(RESULTS))
def test_a_result_waits_for_its_run_a_bounded_time_then_is_retried(flow: Database,
                                                                   result: str) -> None:
    w, attempt, run = started(flow)
    h = run_held(flow, run)
    step = w.start(RESULTS[result], (attempt,))
    assert step.settle() is True and step.blocked_by == [h.pid]
    with pytest.raises(psycopg.Error) as refused:
        step.result(timeout=HANG)
    assert refused.value.sqlstate == "55P03", "a retryable error, which both clients retry"
    assert w.one("show lock_timeout") == "0", "the caller's own lock_timeout is left as it was"
    h.rollback()
    assert w.one(RESULTS[result], (attempt,)) == "accepted"


@pytest.mark.parametrize(("result", "mutant"),
                         [("complete_task", "pgflow-finish-lock-wait-unbounded"),
                          ("complete_many", "pgflow-batch-lock-wait-unbounded")])
def test_negative_control_an_unbounded_result_waits_as_long_as_the_run_is_held(
        flow: Database, result: str, mutant: str) -> None:
    flow.install_mutant(mutant)
    w, attempt, run = started(flow)
    h = run_held(flow, run)
    step = w.start(RESULTS[result], (attempt,))
    assert step.settle() is True
    flow.wait_until("select clock_timestamp() > %s + interval '6 seconds'",
                    (flow.one("select now()"),))
    assert step.settle() is True and step.blocked_by == [h.pid], "still waiting past the bound"
    h.rollback()
    assert step.one() == "accepted"


def test_an_archive_waits_for_its_message_a_bounded_time(mq: Database) -> None:
    mq.sql("select pgmq.create('jobs')")
    mq.sql("select pgmq.send('jobs', '{}')")
    mq.sql("select pgfence.register('r')")
    w = mq.session("w")
    lease = w.acquire("r")
    assert lease is not None
    [(attempt, msg)] = w.run("select attempt_id, msg_id from pgfence_pgmq.read(%s, 'jobs', "
                             "'1 hour')", (lease.lease_id,))
    h = mq.session("h")
    h.begin()
    h.run("select from pgmq.q_jobs where msg_id = %s for update", (msg,))
    h.hold_open()
    step = w.start("select pgfence_pgmq.archive(%s)", (attempt,))
    assert step.settle() is True and step.blocked_by == [h.pid]
    with pytest.raises(psycopg.Error) as refused:
        step.result(timeout=HANG)
    assert refused.value.sqlstate == "55P03"
    h.rollback()
    assert w.one("select pgfence_pgmq.archive(%s)", (attempt,)) == "accepted"

"""No session can wedge a resource by holding its row.

acquire locks the resource row, so a worker that acquires inside a transaction and then idles
(or prepares the transaction) would keep the row locked. Pollers (acquire without an
invocation, request_start) give up on a locked row at once and answer NULL, as for a resource
that is held; paths that must wait (an operator's, a worker started for an invocation) wait at
most lock_timeout, 5 seconds when the caller set none, and then raise 55P03 naming who holds
the row. Each with a negative control.
"""

from __future__ import annotations

import psycopg
import pytest

from testkit.harness import Database, Session


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

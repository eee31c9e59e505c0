"""complete_many under concurrency: two batches over overlapping tasks, given in opposite
orders, never deadlock; the later one waits for the earlier and is told `duplicate` for what
that one completed. The negative control, without the lock in task_id order, deadlocks.

Both batches are held in the middle by a third session that holds one of their tasks (a
handler extending its visibility), so that each has locked part of its rows when the other
starts: the interleaving in which locking in the callers' orders closes a cycle.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg

from testkit.harness import Database, Session, Step
from tests.support import acquired


def claimed(db: Database, n: int) -> list[uuid.UUID]:
    """n tasks claimed under one lease, their attempt ids in task_id order; behind them a
    history of completed tasks, as a queue in use has, so that the batch's UPDATE finds its
    rows by primary key in the order the ids are given (on a table of a few rows it would
    scan the table, in its physical order)."""
    db.sql("insert into pgfence.tasks (queue, payload, state, max_attempts, ready_at, finished_at) "
           "select 'done', '{}', 'completed', 3, clock_timestamp(), clock_timestamp() "
           "from generate_series(1, 10000)")
    db.sql("select pgfence.register('r')")
    for k in range(n):
        db.sql("select pgfence.enqueue('q', %s::jsonb)", (f'{{"n": {k}}}',))
    db.sql("analyze pgfence.tasks")
    worker = db.session("worker")
    lease = acquired(worker.acquire("r"))
    return [a for (a,) in worker.run("select attempt_id from pgfence.claim(%s, 'q', %s) "
                                     "order by task_id", (lease.lease_id, n))]


def batch(s: Session, ids: list[uuid.UUID]) -> Step:
    return s.start("select attempt_id, outcome from pgfence.complete_many(%s, %s::jsonb[])",
                   (ids, [f'{{"by": "{s.name}"}}'] * len(ids)))


def outcome(step: Step) -> list[tuple[Any, ...]] | str:
    try:
        return step.result()
    except psycopg.Error as e:
        return str(e.sqlstate)


def opposite_order_batches(db: Database) -> tuple[list[tuple[Any, ...]] | str,
                                                   list[tuple[Any, ...]] | str,
                                                   list[int], list[uuid.UUID], int]:
    """A completes tasks 1-4 in that order, B tasks 5, 4, 3, 2; C holds task 3 while both
    start. What each was told (rows, or the SQLSTATE it failed with), whom B waited for, the
    attempt ids, and A's pid."""
    w = claimed(db, 5)
    a, b, c = db.session("a"), db.session("b"), db.session("c")
    c.begin()
    c.run("select pgfence.extend(%s, '1 minute')", (w[2],))
    a.begin()
    step_a = batch(a, w[0:4])
    assert step_a.settle() and step_a.blocked_by == [c.pid], "A waits for C's task 3"
    b.begin()
    step_b = batch(b, [w[4], w[3], w[2], w[1]])
    assert step_b.settle(), "B waits"
    b_waited_for = step_b.blocked_by
    c.commit()
    got_a = outcome(step_a)
    a.commit()  # a rollback if A failed
    got_b = outcome(step_b)
    b.commit()
    return got_a, got_b, b_waited_for, w, a.pid


def test_opposite_order_batches_never_deadlock(db: Database) -> None:
    got_a, got_b, b_waited_for, w, a_pid = opposite_order_batches(db)
    assert got_a != "40P01" and got_b != "40P01", "a deadlock"
    assert b_waited_for == [a_pid], "B waited for A's lock on task 2, holding none of A's tasks"
    assert got_a == [(w[0], "accepted"), (w[1], "accepted"), (w[2], "accepted"), (w[3], "accepted")]
    assert got_b == [(w[4], "accepted"), (w[3], "duplicate"), (w[2], "duplicate"),
                     (w[1], "duplicate")], "in B's order"
    assert db.sql("select result->>'by', count(*) from pgfence.tasks where queue = 'q' "
                  "and state = 'completed' group by 1 order by 1") == [("a", 4), ("b", 1)]


def test_negative_control_locking_in_the_callers_order_deadlocks(db: Database) -> None:
    db.install_mutant("complete-many-unordered-lock")  # no lock taken
    got_a, got_b, _, _, _ = opposite_order_batches(db)
    assert "40P01" in (got_a, got_b)


# --- issue 45 item 4: complete_many's UPDATE is planned once, not on every call ---------------

def update_plan(db: Database) -> str:
    """The plan complete_many's UPDATE ran with, on a call of one id (the batch a worker at
    batch 1 sends), as auto_explain logs it."""
    ids = claimed(db, 1)
    logs: list[str] = []
    with psycopg.connect(db.server_dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: logs.append(d.message_primary or ""))
        conn.execute("load 'auto_explain'")
        conn.execute("set auto_explain.log_min_duration = 0")
        conn.execute("set auto_explain.log_nested_statements = on")
        conn.execute("set client_min_messages = log")
        got = conn.execute("select outcome from pgfence.complete_many(%s)", (ids,)).fetchall()
    assert got == [("accepted",)]
    [plan] = [m for m in logs if "Update on tasks" in m]
    return plan


def test_the_batch_update_runs_its_generic_plan(db: Database) -> None:
    """A custom plan, made for the call's values, is what plpgsql keeps choosing for a batch of
    one, and planning this UPDATE costs several times its execution. The generic plan refers to
    the signing key read into a variable as a parameter; a custom plan has it folded in as a
    constant. (The plan is never printed: it would show the key.)"""
    plan = update_plan(db)
    by_key, key_a_parameter = "tasks_pkey" in plan, bool(re.search(r"substr\(\$\d+", plan))
    assert by_key, "the tasks not found by primary key"
    assert key_a_parameter, "the key is not a parameter: a custom plan"


def test_negative_control_a_custom_plan_has_the_key_folded_in(db: Database) -> None:
    db.install_mutant("complete-many-custom-plan")
    plan = update_plan(db)
    key_a_parameter = bool(re.search(r"substr\(\$\d+", plan))
    key_a_constant = bool(re.search(r"byteacat\('\\x", plan))
    assert not key_a_parameter, "the key is a parameter: a generic plan"
    assert key_a_constant, "no key folded in as a constant"


def task_locks_written(db: Database, ids: list[uuid.UUID]) -> int:
    """The row-lock WAL records on pgfence.tasks that one complete_many of ``ids`` writes
    (pg_walinspect), its answers all `accepted`."""
    db.sql("create extension if not exists pg_walinspect")
    with psycopg.connect(db.server_dsn, autocommit=True) as conn:
        # The end is the flushed WAL (pg_walinspect reads no further), which the commit,
        # synchronous, has brought past every record of the call.
        conn.execute("set synchronous_commit = on")
        start = conn.execute("select pg_current_wal_insert_lsn()").fetchone()
        got = conn.execute("select outcome from pgfence.complete_many(%s)", (ids,)).fetchall()
        end = conn.execute("select pg_current_wal_flush_lsn()").fetchone()
    assert start is not None and end is not None
    assert got == [("accepted",)] * len(ids)
    # The table's file in this database (another database's may have the same number).
    rel = db.one("select d.oid || '/' || pg_relation_filenode('pgfence.tasks') "
                 "from pg_database d where d.datname = current_database()")
    return int(db.one("select count(*) from pg_get_wal_records_info(%s, %s) "
                      "where resource_manager = 'Heap' and record_type = 'LOCK' "
                      "and strpos(block_ref, '/' || %s || ' ') > 0",
                      (start[0], end[0], rel)))


def test_a_batch_of_one_locks_its_row_once(db: Database) -> None:
    """One id cannot close a cycle, so its row is locked by the UPDATE alone, as complete's:
    no lock record of its own. A batch of several is locked first, in task_id order, one
    lock record a row."""
    ids = claimed(db, 3)
    assert task_locks_written(db, ids[:1]) == 0
    assert task_locks_written(db, ids[1:]) == 2


def test_negative_control_a_batch_of_one_locked_first(db: Database) -> None:
    db.install_mutant("complete-many-locks-one-first")
    ids = claimed(db, 1)
    assert task_locks_written(db, ids) == 1

"""The pgmq layer against the real pgmq (1.13, installed by scripts/setup), directly and
through PgBouncer in transaction mode: the scenarios of a worker fleet on a pgmq queue, each
with a negative control that breaks the mechanism it rests on and sees the scenario fail.

Time passing is simulated (pgfence_test.expire, expire_message); blocking is observed with
pg_blocking_pids(), never waited out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgfence.releases import key as version_key
from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database, Lease, Session, Step, sqlstate
from tests.support import PGMQ_SQL, acquired
from tests.test_upgrade import HEAD, RELEASES, Databases


def queue(db: Database, messages: int = 3, resources: tuple[str, ...] = ("r1",)) -> None:
    """Queue `jobs` with `messages` messages, and the resources that serve it."""
    db.sql("select pgmq.create('jobs')")
    for r in resources:
        db.sql("select pgfence.register(%s)", (r,))
    for n in range(messages):
        db.sql("select pgmq.send('jobs', %s::jsonb)", (f'{{"n": {n}}}',))


def read(s: Session, lease: Lease, qty: int = 1) -> list[tuple[Any, ...]]:
    """(attempt_id, msg_id, read_ct) of each message read."""
    return [(a, m, c) for a, m, c in s.run(
        "select attempt_id, msg_id, read_ct from pgfence_pgmq.read(%s, 'jobs', '30 seconds', %s)",
        (lease.lease_id, qty))]


def finish(s: Session, how: str, attempt_id: uuid.UUID) -> str:
    return str(s.one(f"select pgfence_pgmq.{how}(%s)", (attempt_id,)))


def message(db: Database, msg_id: int) -> tuple[int, bool] | None:
    """(read_ct, visible now) of a message still in the queue, None if it is gone."""
    rows = db.sql("select read_ct, vt <= clock_timestamp() from pgmq.q_jobs where msg_id = %s",
                  (msg_id,))
    return None if not rows else (rows[0][0], rows[0][1])


def taken_over(db: Database) -> tuple[Session, Lease, Session, Lease]:
    """A held r1 and paused past its lease; B holds r1 now."""
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r1"))
    db.expire(la)
    lb = acquired(b.acquire("r1"))
    return a, la, b, lb


# -- a paused owner wakes up after its successor started --------------------------------------

def test_a_stale_owner_reads_nothing(any_mq: Database) -> None:
    queue(any_mq)
    a, la, b, lb = taken_over(any_mq)
    assert sqlstate(lambda: read(a, la)) == "PF001"
    assert [m for _, m, _ in read(b, lb, 3)] == [1, 2, 3]


def test_negative_control_a_read_without_the_lease_check(mq: Database) -> None:
    mq.install_mutant("pgmq-read-no-lease-check")
    queue(mq)
    a, la, _, _ = taken_over(mq)
    assert len(read(a, la)) == 1, "without the check the stale owner reads"


@pytest.mark.parametrize("how", ["archive", "delete"])
def test_the_stale_result_of_a_message_read_again_is_recorded(any_mq: Database, how: str) -> None:
    queue(any_mq, 1)
    a, b = any_mq.session("a"), any_mq.session("b")
    la = acquired(a.acquire("r1"))
    [(stale, msg, _)] = read(a, la)
    any_mq.expire(la)
    any_mq.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    lb = acquired(b.acquire("r1"))
    [(fresh, msg_again, read_ct)] = read(b, lb)
    assert (msg_again, read_ct) == (msg, 2)

    assert finish(a, how, stale) == "stale"
    assert finish(a, how, stale) == "stale"  # a retry adds no second record
    assert message(any_mq, msg) == (2, False), "B's message is untouched"
    assert any_mq.sql("select msg_id, read_ct, kind, queue from pgfence_pgmq.stale_results "
                      "where attempt_id = %s", (stale,)) == [(msg, 1, how, "jobs")]
    assert finish(b, how, fresh) == "accepted"
    assert message(any_mq, msg) is None
    archived = any_mq.sql("select read_ct from pgmq.a_jobs where msg_id = %s", (msg,))
    assert archived == ([(2,)] if how == "archive" else [])


def test_negative_control_without_the_read_count_the_stale_archive_lands(mq: Database) -> None:
    # Both of the rule's witnesses of a later read: the message's read count, and the layer's
    # own record of reads (a later read of the same message).
    mq.install_mutant("pgmq-finish-ignores-read-ct", "pgmq-finish-ignores-later-read")
    queue(mq, 1)
    a, b = mq.session("a"), mq.session("b")
    la = acquired(a.acquire("r1"))
    [(stale, msg, _)] = read(a, la)
    mq.expire(la)
    mq.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    read(b, acquired(b.acquire("r1")))
    assert finish(a, "archive", stale) == "accepted"
    assert message(mq, msg) is None, "the stale attempt archived the message B holds"


@pytest.mark.parametrize("mode", ["unprotected", "enforce"])
def test_a_late_result_nobody_overtook_is_kept(any_mq: Database, mode: str) -> None:
    queue(any_mq, 1)
    if mode == "enforce":
        any_mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'enforce', consumers_only "
                   "=> true)")
    a, b = any_mq.session("a"), any_mq.session("b")
    la = acquired(a.acquire("r1"))
    [(attempt, msg, _)] = read(a, la)
    any_mq.expire(la)
    lb = acquired(b.acquire("r1"))
    assert read(b, lb) == [], "the message is still A's (its vt has not run out)"
    assert finish(a, "archive", attempt) == "accepted"
    assert finish(a, "archive", attempt) == "duplicate"
    assert finish(a, "delete", attempt) == "duplicate"
    assert any_mq.sql("select read_ct from pgmq.a_jobs where msg_id = %s", (msg,)) == [(1,)]
    assert any_mq.one("select count(*) from pgfence.stale_results") == 0
    # The late archive admitted that one write only: the stale owner's transaction is not
    # fenced by it.
    a.begin()
    finish(a, "archive", attempt)
    assert a.one("select coalesce(current_setting('pgfence.fenced', true), '')") == ""
    a.rollback()


def test_negative_control_a_late_result_judged_by_its_lease(mq: Database) -> None:
    mq.install_mutant("pgmq-finish-needs-live-lease")
    queue(mq, 1)
    a, b = mq.session("a"), mq.session("b")
    la = acquired(a.acquire("r1"))
    [(attempt, _, _)] = read(a, la)
    mq.expire(la)
    acquired(b.acquire("r1"))
    assert sqlstate(lambda: finish(a, "archive", attempt)) == "PF001", "a valid result thrown away"


def test_negative_control_a_late_result_without_its_marker_is_refused(mq: Database) -> None:
    mq.install_mutant("pgmq-finish-unmarked")
    queue(mq, 1)
    mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'enforce', consumers_only => true)")
    a = mq.session("a")
    la = acquired(a.acquire("r1"))
    [(attempt, _, _)] = read(a, la)
    mq.expire(la)
    assert sqlstate(lambda: finish(a, "archive", attempt)) == "PF007"


def test_set_vt_keeps_the_message_for_its_attempt_only(any_mq: Database) -> None:
    queue(any_mq, 1)
    a, b = any_mq.session("a"), any_mq.session("b")
    la = acquired(a.acquire("r1"))
    [(attempt, msg, _)] = read(a, la)
    vt = a.one("select pgfence_pgmq.set_vt(%s, '2 minutes')", (attempt,))
    assert vt == any_mq.one("select vt from pgmq.q_jobs where msg_id = %s", (msg,))
    assert any_mq.one("select vt - last_read_at > interval '119 seconds' from pgmq.q_jobs") is True
    any_mq.expire(la)
    any_mq.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    read(b, acquired(b.acquire("r1")))
    assert a.one("select pgfence_pgmq.set_vt(%s, '2 minutes')", (attempt,)) is None


# -- replicas, deaths and long transactions ---------------------------------------------------

def test_two_resources_on_one_queue_read_in_parallel(mq: Database) -> None:
    queue(mq, 4, resources=("r1", "r2"))
    mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1', 'r2'], 'enforce', consumers_only "
           "=> true)")
    a, b = mq.session("a"), mq.session("b")
    la, lb = acquired(a.acquire("r1")), acquired(b.acquire("r2"))
    a.begin()
    mine = {m for _, m, _ in read(a, la, 2)}
    step = b.start("select msg_id from pgfence_pgmq.read(%s, 'jobs', '30 seconds', 2)",
                   (lb.lease_id,))
    assert step.settle() is False, "B waited for A"
    theirs = {m for (m,) in step.result()}
    a.commit()
    assert mine | theirs == {1, 2, 3, 4} and not mine & theirs


def test_negative_control_readers_that_wait_for_each_other(mq: Database) -> None:
    # One lock per queue, as a reader that serialized its readers would take.
    mq.install_mutant("pgmq-read-serialized")
    queue(mq, 4, resources=("r1", "r2"))
    a, b = mq.session("a"), mq.session("b")
    la, lb = acquired(a.acquire("r1")), acquired(b.acquire("r2"))
    a.begin()
    read(a, la, 2)
    step = b.start("select msg_id from pgfence_pgmq.read(%s, 'jobs', '30 seconds', 2)",
                   (lb.lease_id,))
    assert step.settle() is True and step.blocked_by == [a.pid]
    a.commit()
    step.result()


# pgmq sets last_read_at and vt from two clock_timestamp() calls, a microsecond or so apart.
COMES_BACK_AFTER_VT = ("select vt - last_read_at between interval '30 seconds' "
                       "and interval '31 seconds' from pgmq.q_jobs where msg_id = %s")


def test_a_reader_killed_mid_read_loses_nothing(mq: Database) -> None:
    queue(mq, 2)
    a = mq.session("a")
    la = acquired(a.acquire("r1"))
    a.begin()
    assert len(read(a, la, 2)) == 2
    pid = a.pid
    mq.sql("select pg_terminate_backend(%s)", (pid,))
    # It returns before the backend is gone; B's read skips rows still locked by it.
    mq.wait_until("select not exists (select from pg_stat_activity where pid = %s)", (pid,))
    assert message(mq, 1) == (0, True) and message(mq, 2) == (0, True), "the read never committed"
    # A reader that dies after its read committed: the messages come back when vt runs out.
    b = mq.session("b")
    mq.expire(la)
    lb = acquired(b.acquire("r1"))
    [(attempt, msg, _)] = read(b, lb)
    b.close()
    assert mq.one(COMES_BACK_AFTER_VT, (msg,)) is True
    mq.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    c = mq.session("c")
    mq.expire(lb)
    lc = acquired(c.acquire("r1"))
    assert [(m, n) for _, m, n in read(c, lc, 2)] == [(1, 2), (2, 1)]
    assert mq.one("select pgfence_pgmq.archive(%s)", (attempt,)) == "stale"


def test_negative_control_a_read_that_never_gives_the_message_back(mq: Database) -> None:
    mq.install_mutant("pgmq-read-vt-in-ms")
    queue(mq, 1)
    a = mq.session("a")
    [(_, msg, _)] = read(a, acquired(a.acquire("r1")))
    assert mq.one(COMES_BACK_AFTER_VT, (msg,)) is False


def test_a_read_inside_a_longer_transaction_holds_off_a_takeover(any_mq: Database) -> None:
    queue(any_mq)
    a, b = any_mq.session("a"), any_mq.session("b")
    la = acquired(a.acquire("r1"))
    a.begin()
    read(a, la)
    any_mq.expire(la)
    step = b.start("select (pgfence.acquire('r1', 'b', '30 seconds')).generation")
    assert step.settle() is True and step.blocked_by == [a.pid]
    a.commit()
    assert step.one() == la.generation + 1


def test_negative_control_a_read_that_does_not_hold_its_lock(mq: Database) -> None:
    mq.install_mutant("hold-current-no-lock")
    queue(mq)
    a, b = mq.session("a"), mq.session("b")
    la = acquired(a.acquire("r1"))
    a.begin()
    read(a, la)
    mq.expire(la)
    step = b.start("select (pgfence.acquire('r1', 'b', '30 seconds')).generation")
    assert step.settle() is False, "the takeover did not wait for the read's transaction"
    assert step.one() == la.generation + 1
    a.rollback()


# -- batches ------------------------------------------------------------------------------------

def opposite_order_archives(db: Database) -> tuple[list[tuple[Any, ...]] | str,
                                                   list[tuple[Any, ...]] | str,
                                                   list[int], list[uuid.UUID], int]:
    """Five messages read by one worker; A archives 1-4 in that order, B 5, 4, 3, 2, while C (a
    retry of message 3's archive on another connection) holds message 3's attempt. What each
    was told (rows, or the SQLSTATE it failed with), whom B waited for, the attempt ids by
    message, and A's pid."""
    queue(db, 5)
    w = db.session("worker")
    ids = [attempt for attempt, _, _ in read(w, acquired(w.acquire("r1")), 5)]
    a, b, c = db.session("a"), db.session("b"), db.session("c")

    def told(step: Step) -> list[tuple[Any, ...]] | str:
        try:
            return step.result()
        except psycopg.Error as e:
            return str(e.sqlstate)

    c.begin()
    assert finish(c, "archive", ids[2]) == "accepted"
    a.begin()
    step_a = a.start("select * from pgfence_pgmq.archive_many(%s)", (ids[0:4],))
    assert step_a.settle() and step_a.blocked_by == [c.pid], "A waits for C's attempt"
    b.begin()
    step_b = b.start("select * from pgfence_pgmq.archive_many(%s)",
                     ([ids[4], ids[3], ids[2], ids[1]],))
    assert step_b.settle(), "B waits"
    b_waited_for = step_b.blocked_by
    c.commit()
    got_a = told(step_a)
    a.commit()  # a rollback if A failed
    got_b = told(step_b)
    b.commit()
    return got_a, got_b, b_waited_for, ids, a.pid


def test_opposite_order_batches_never_deadlock(mq: Database) -> None:
    got_a, got_b, b_waited_for, ids, a_pid = opposite_order_archives(mq)
    assert got_a != "40P01" and got_b != "40P01", "a deadlock"
    assert b_waited_for == [a_pid], "B waited for A's lock on message 2's attempt, holding none"
    assert got_a == [(ids[0], "accepted"), (ids[1], "accepted"), (ids[2], "duplicate"),
                     (ids[3], "accepted")]
    assert got_b == [(ids[4], "accepted"), (ids[3], "duplicate"), (ids[2], "duplicate"),
                     (ids[1], "duplicate")], "in B's order"
    assert mq.sql("select msg_id from pgmq.a_jobs order by msg_id") == [(m,) for m in range(1, 6)]
    assert mq.one("select count(*) from pgfence.stale_results") == 0


def test_negative_control_locking_in_the_callers_order_deadlocks(mq: Database) -> None:
    mq.install_mutant("pgmq-finish-callers-order")
    got_a, got_b, _, _, _ = opposite_order_archives(mq)
    assert "40P01" in (got_a, got_b)


# -- old binaries that poll pgmq directly ------------------------------------------------------

def test_an_old_binary_polling_directly_is_seen_then_refused(any_mq: Database) -> None:
    queue(any_mq, 2)
    any_mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'observe', consumers_only => "
               "true)")
    old = any_mq.session("old")
    [(msg,)] = old.run("select msg_id from pgmq.read('jobs', 30, 1)")
    assert old.one("select pgmq.archive('jobs', %s::bigint)", (msg,)) is True
    assert any_mq.sql("select table_name, resource, operation, mode from pgfence.unfenced_writes "
                      "order by id") == [("pgmq.q_jobs", "r1", "UPDATE", "observe"),
                                         ("pgmq.q_jobs", "r1", "DELETE", "observe")]
    any_mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'enforce', consumers_only => "
               "true)")
    assert sqlstate(lambda: old.run("select * from pgmq.read('jobs', 30, 1)")) == "PF007"
    assert sqlstate(lambda: old.run("select pgmq.delete('jobs', 2::bigint)")) == "PF007"
    assert sqlstate(lambda: old.run("select * from pgmq.set_vt('jobs', 2::bigint, 0)")) == "PF007"
    # Producers need no lease; converted workers read as before.
    assert old.one("select pgmq.send('jobs', '{}'::jsonb)") == 3
    new = any_mq.session("new")
    lease = acquired(new.acquire("r1"))
    assert [m for _, m, _ in read(new, lease, 5)] == [2, 3]
    assert any_mq.one("select healthy from pgfence.protected_tables") is True


def test_negative_control_a_guard_blind_to_consumers(mq: Database) -> None:
    mq.install_mutant("protect-consumers-only-blind")
    queue(mq, 1)
    mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'observe', consumers_only => true)")
    mq.session("old").run("select * from pgmq.read('jobs', 30, 1)")
    assert mq.one("select count(*) from pgfence.unfenced_writes") == 0


def test_a_partitioned_queue_is_read_but_not_protected(mq: Database) -> None:
    # pgmq makes partitioned queues with pg_partman, which is not installed here: the same
    # shape by hand.
    mq.sql("""
      create table pgmq.q_parted (msg_id bigint generated always as identity,
        read_ct int not null default 0, enqueued_at timestamptz not null default now(),
        last_read_at timestamptz, vt timestamptz not null, message jsonb, headers jsonb)
        partition by range (msg_id);
      create table pgmq.q_parted_1 partition of pgmq.q_parted for values from (1) to (1000);
      insert into pgmq.meta (queue_name, is_partitioned, is_unlogged)
      values ('parted', true, false);
      select pgfence.register('r1');""")
    for tbl in ("pgmq.q_parted", "pgmq.q_parted_1"):
        with pytest.raises(psycopg.Error, match="must be a plain table") as e:
            mq.sql("select pgfence.protect(%s::regclass, array['r1'], 'enforce', consumers_only "
                   "=> true)", (tbl,))
        assert e.value.sqlstate == "22023"
    # The layer reads and finishes it as any other queue.
    mq.sql("select pgmq.send('parted', '{\"n\": 1}'::jsonb)")
    s = mq.session("s")
    lease = acquired(s.acquire("r1"))
    [(attempt, msg)] = s.run("select attempt_id, msg_id from pgfence_pgmq.read(%s, 'parted', "
                             "'30 seconds', 5)", (lease.lease_id,))
    assert s.one("select pgfence_pgmq.delete(%s)", (attempt,)) == "accepted"
    assert mq.one("select count(*) from pgmq.q_parted where msg_id = %s", (msg,)) == 0


# -- arguments and installs --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q;drop table x", "jobs--", "a" * 48, "", "j'obs", "nosuch"])
def test_hostile_and_unknown_queue_names_are_refused(mq: Database, name: str) -> None:
    queue(mq, 1)
    s = mq.session("s")
    lease = acquired(s.acquire("r1"))
    with pytest.raises(psycopg.Error, match="invalid argument queue") as e:
        s.run("select * from pgfence_pgmq.read(%s, %s, '30 seconds', 1)", (lease.lease_id, name))
    assert e.value.sqlstate == "22023"


@pytest.mark.parametrize("how", ["extension", "sql"])
def test_the_layer_installs_on_either_form_of_pgmq(cluster: Cluster, how: str) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    try:
        if how == "extension":
            install.prerequisites(cluster, name, ["pgmq"])
        else:
            cluster.psql(name, "-f", PGMQ_SQL)   # pgmq's own SQL install, not the extension
        install.install(cluster, name, ["pgmq"], with_prerequisites=False)
        db = Database(cluster.dsn(name))
        try:
            queue(db, 1)
            s = db.session("s")
            [(attempt, _, _)] = read(s, acquired(s.acquire("r1")))
            assert finish(s, "delete", attempt) == "accepted"
        finally:
            db.close()
    finally:
        cluster.drop_database(name)


def test_every_queue_name_pgmq_accepts_is_accepted(mq: Database) -> None:
    mq.sql("select pgmq.create('Queue-Hyphened_2')")
    mq.sql("select pgmq.send('Queue-Hyphened_2', '{}')")
    mq.sql("select pgfence.register('r1')")
    s = mq.session("s")
    [(attempt,)] = s.run("select attempt_id from pgfence_pgmq.read(%s, 'Queue-Hyphened_2', "
                         "'30 seconds', 1)", (acquired(s.acquire("r1")).lease_id,))
    assert finish(s, "delete", attempt) == "accepted"


# -- what update windows see of the layer (the conformance suite counts its work in flight) ---

def window(db: Database, resource: str) -> uuid.UUID:
    return uuid.UUID(str(db.session("op").one("select pgfence.prepare_update(array[%s], %s)",
                                               (resource, uuid.uuid4()))))


def status(db: Database, token: uuid.UUID) -> tuple[str, dict[str, int], list[dict[str, Any]]]:
    [(verdict, in_flight, writes)] = db.sql(
        "select verdict, in_flight, unfenced_writes from pgfence.update_status(%s)", (token,))
    return verdict, in_flight, writes


def test_a_message_visible_again_is_no_longer_in_flight(mq: Database) -> None:
    queue(mq)
    w = mq.session("w")
    lease = acquired(w.acquire("r1"))
    [(_, msg, _)] = read(w, lease)
    w.release(lease)
    token = window(mq, "r1")
    assert status(mq, token)[:2] == ("draining", {"tasks": 0, "pgmq": 1})
    mq.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    assert status(mq, token)[:2] == ("drained", {"tasks": 0})


def test_unfenced_writes_since_the_window_opened_are_listed(any_mq: Database) -> None:
    queue(any_mq)
    any_mq.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'observe', consumers_only "
               "=> true)")
    old = any_mq.session("old-binary")
    old.run("select * from pgmq.read('jobs', 30, 1)")  # before the window: not this window's
    token = window(any_mq, "r1")
    assert status(any_mq, token)[2] == []
    old.run("select * from pgmq.read('jobs', 30, 1)")
    [verdict, _, [write]] = status(any_mq, token)
    assert (write["table"], write["operation"], write["writes"]) == ("pgmq.q_jobs", "UPDATE", 1)
    assert verdict == "drained", "an unconverted writer is named; the window waits for no write"


# -- the layer's own prune (the conformance suite runs it with the core's) ----------------------

def prune_setup(db: Database) -> tuple[Session, uuid.UUID]:
    """Two reads, one archived long ago; returns the session and the open read's attempt."""
    queue(db)
    w = db.session("w")
    lease = acquired(w.acquire("r1"))
    [(done, _, _)] = read(w, lease)
    [(open_read, _, _)] = read(w, lease)
    assert finish(w, "archive", done) == "accepted"
    db.sql("update pgfence_pgmq.attempts set read_at = read_at - interval '2 days', "
           "finished_at = finished_at - interval '2 days'")
    return w, open_read


def test_prune_drops_old_finished_reads_never_an_open_one(mq: Database) -> None:
    w, open_read = prune_setup(mq)
    assert mq.sql("select * from pgfence_pgmq.prune('1 day')") == [
        ("pgfence_pgmq.stale_results", 0), ("pgfence_pgmq.attempts", 1)]
    assert finish(w, "archive", open_read) == "accepted"
    # Finished just now: younger than the bound, kept.
    assert mq.sql("select * from pgfence_pgmq.prune('1 day')") == [
        ("pgfence_pgmq.stale_results", 0), ("pgfence_pgmq.attempts", 0)]


def test_the_cores_prune_drops_them_too(mq: Database) -> None:
    w, open_read = prune_setup(mq)
    pruned = dict(mq.sql("select * from pgfence.prune('1 day')"))
    assert pruned["pgfence_pgmq.attempts"] == 1 and pruned["pgfence_pgmq.stale_results"] == 0
    assert finish(w, "archive", open_read) == "accepted"


def test_negative_control_a_prune_blind_to_outcomes_loses_an_open_read(mq: Database) -> None:
    mq.install_mutant("pgmq-prune-open-reads")
    w, open_read = prune_setup(mq)
    mq.sql("select * from pgfence_pgmq.prune('1 day')")
    assert sqlstate(lambda: finish(w, "archive", open_read)) == "22023"


# -- abandoned reads are pruned, with the leases they named (issue 40) ---------------------------

def abandoned_read(db: Database) -> tuple[Session, uuid.UUID, uuid.UUID]:
    """A poison message: read under `old`, whose worker died, read again under a new lease;
    the first read, and the old lease (superseded), two days old. Returns the session, the
    live read, and the old lease's id."""
    queue(db, 1)
    w = db.session("w")
    old = acquired(w.acquire("r1", owner="old"))
    [(_, msg, _)] = read(w, old)
    db.expire(old)
    db.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    [(live, _, _)] = read(w, acquired(w.acquire("r1", owner="new")))
    db.sql("update pgfence_pgmq.attempts set read_at = read_at - interval '2 days' "
           "where lease_id = %s", (old.lease_id,))
    db.sql("update pgfence.leases set ended_at = ended_at - interval '2 days' "
           "where lease_id = %s", (old.lease_id,))
    return w, live, old.lease_id


def test_an_abandoned_read_and_its_lease_are_pruned(mq: Database) -> None:
    w, live, old = abandoned_read(mq)
    pruned = dict(mq.sql("select * from pgfence.prune('1 day')"))
    assert pruned["pgfence_pgmq.attempts"] == 1, "the read that can never be accepted"
    assert pruned["leases"] == 1, "and the lease it named, kept no more"
    assert mq.one("select count(*) from pgfence.leases where lease_id = %s", (old,)) == 0
    assert finish(w, "archive", live) == "accepted", "the live one kept"


def test_negative_control_an_abandoned_read_pins_its_lease_for_ever(mq: Database) -> None:
    mq.install_mutant("pgmq-leases-any-open", "prune-attempts-keeps-abandoned")
    _, _, old = abandoned_read(mq)
    pruned = dict(mq.sql("select * from pgfence.prune('1 day')"))
    assert (pruned["pgfence_pgmq.attempts"], pruned["leases"]) == (0, 0)
    assert mq.one("select count(*) from pgfence.leases where lease_id = %s", (old,)) == 1


# -- reads recorded before 0.3.0 (no read order) are judged by their read count after it ---------

MQ_STARTS = sorted((p.name.removeprefix("pgfence-pgmq--").removesuffix(".sql")
                    for p in RELEASES.glob("pgfence-pgmq--*.sql")), key=version_key)
# The releases of the layer whose reads have no read order (0.3.0 added it).
UNORDERED = [v for v in MQ_STARTS if version_key(v) < version_key("0.3.0")]


@pytest.fixture
def dbs(cluster: Cluster) -> Iterator[Databases]:
    made = Databases(cluster)
    yield made
    for name in made.made:
        cluster.drop_database(name)


def reads_across_the_upgrade(dbs: Databases, start: str,
                             mutant: str = "") -> tuple[bool, str, list[str], list[str], int]:
    """Under release `start` of the layer (whose reads have no read order), reads of messages
    1 to 3 and, once their visibility ran out, later reads of them; then the layer upgraded to
    the head (with the core). What the stale reads are told: set_vt of the first (whether
    NULL), archive of the first, archive_many of the other two (a batch: its own statement);
    then what archive_many of the later reads is told, and how many messages are left."""
    name = dbs.fresh("mqreads")
    install.prerequisites(dbs.cluster, name, ["pgmq"])
    dbs.install_release(name, start)
    dbs.psql(name, "--single-transaction", "-f", RELEASES / f"pgfence-pgmq--{start}.sql")
    db = Database(dbs.dsn(name))
    try:
        queue(db, 3)
        w = db.session("before")
        lease = acquired(w.acquire("r1"))
        stale = [a for a, _, _ in read(w, lease, 3)]
        db.sql("update pgmq.q_jobs set vt = clock_timestamp()")
        fresh = [a for a, _, _ in read(w, lease, 3)]
        dbs.upgrade_by_file(name, start, ("pgmq",))
        if mutant:
            db.install_mutant(mutant)
        after = db.session("after")
        kept = after.one("select pgfence_pgmq.set_vt(%s, '1 hour')", (stale[0],)) is None
        one = finish(after, "archive", stale[0])
        many = [str(o) for _, o in after.run(
            "select * from pgfence_pgmq.archive_many(%s::uuid[])", (stale[1:],))]
        later = [str(o) for _, o in after.run(
            "select * from pgfence_pgmq.archive_many(%s::uuid[])", (fresh,))]
        return kept, one, many, later, int(db.one("select count(*) from pgmq.q_jobs"))
    finally:
        db.close()


@pytest.mark.parametrize("start", UNORDERED)
def test_reads_recorded_before_the_read_order_are_judged_by_their_read_count(
        dbs: Databases, start: str) -> None:
    assert reads_across_the_upgrade(dbs, start) == (
        True, "stale", ["stale", "stale"], ["accepted"] * 3, 0)


def test_negative_control_without_the_read_count_an_old_stale_read_archives(
        dbs: Databases) -> None:
    _, one, _, later, _ = reads_across_the_upgrade(dbs, UNORDERED[-1],
                                                   "pgmq-finish-ignores-read-ct")
    assert (one, later[0]) == ("accepted", "stale"), "the stale read archived the later one's"


# -- a message put back under an old id is another message -----------------------------------

def put_back(db: Database) -> tuple[str, tuple[int, bool] | None]:
    """A reads message 1; someone outside the layer deletes it (pgmq.delete: an operator, a
    plain consumer), and a producer puts a message back under its msg_id with A's read count
    (nobody read it through the layer since). What A's archive is told, and the message."""
    queue(db, 1)
    a = db.session("a")
    [(attempt, msg, _)] = read(a, acquired(a.acquire("r1")))
    db.sql("select pgmq.delete('jobs', %s::bigint)", (msg,))
    db.sql("insert into pgmq.q_jobs (msg_id, read_ct, enqueued_at, vt, message) "
           "overriding system value "
           "select msg_id, read_ct, clock_timestamp(), clock_timestamp() + interval '1 hour', "
           "'{\"again\": true}' from pgfence_pgmq.attempts where attempt_id = %s", (attempt,))
    return finish(a, "archive", attempt), message(db, msg)


def test_a_message_put_back_under_an_old_id_is_not_the_attempts(any_mq: Database) -> None:
    assert put_back(any_mq) == ("stale", (1, False)), "the producer's message is left alone"


def test_negative_control_judged_without_enqueued_at_the_attempt_archives_it(
        mq: Database) -> None:
    mq.install_mutant("pgmq-finish-ignores-enqueued-at")
    assert put_back(mq) == ("accepted", None)


# -- each call needs what pgmq itself needs (the conformance suite checks one of them for every
# layer) -----------------------------------------------------------------------------------------

def test_each_call_needs_what_pgmq_itself_needs(mq: Database) -> None:
    queue(mq)
    role = f"w_{uuid.uuid4().hex[:10]}"
    mq.sql(f"create role {role} in role pgfence_worker")
    try:
        w = mq.session(role)
        w.run(f"set role {role}")
        lease = acquired(w.acquire("r1"))
        assert sqlstate(lambda: read(w, lease)) == "42501", "no pgmq privilege: no read"
        assert mq.one("select sum(read_ct) from pgmq.q_jobs") == 0
        # What pgmq itself needs to read: the read works, and so does set_vt.
        mq.sql(f"grant usage on schema pgmq to {role}")
        mq.sql(f"grant select, update on pgmq.q_jobs to {role}")
        [(attempt, _, _)] = read(w, lease)
        assert w.one("select pgfence_pgmq.set_vt(%s, '1 minute') is not null", (attempt,)) is True
        assert sqlstate(lambda: finish(w, "delete", attempt)) == "42501"
        mq.sql(f"grant delete on pgmq.q_jobs to {role}")
        assert sqlstate(lambda: finish(w, "archive", attempt)) == "42501", \
            "archive needs the archive table too"
        assert sqlstate(lambda: w.run("select * from pgfence_pgmq.archive_many(array[%s]::uuid[])",
                                      (attempt,))) == "42501"
        mq.sql(f"grant insert on pgmq.a_jobs to {role}")
        assert finish(w, "archive", attempt) == "accepted"
        w.close()
    finally:
        mq.sql(f"drop owned by {role}")
        mq.sql(f"drop role {role}")


# -- a producer cannot revive a stale attempt (issue 40) ----------------------------------------

def revived(db: Database) -> tuple[Session, uuid.UUID, int]:
    """A read `stale` of message 1, read again since by B, who deleted it; then a producer with
    pgmq's usual grants puts the message back as the stale read saw it (msg_id, read_ct,
    enqueued_at): the message's row alone says the stale read still holds it."""
    queue(db, 1)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r1"))
    [(stale, msg, _)] = read(a, la)
    db.expire(la)
    db.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    [(fresh, _, _)] = read(b, acquired(b.acquire("r1")))
    assert finish(b, "delete", fresh) == "accepted"
    db.sql("insert into pgmq.q_jobs (msg_id, read_ct, enqueued_at, vt, message) "
           "overriding system value "
           "select msg_id, read_ct, enqueued_at, clock_timestamp(), '{\"again\": true}' "
           "from pgfence_pgmq.attempts where attempt_id = %s", (stale,))
    return a, stale, msg


@pytest.mark.parametrize("how", ["archive", "delete"])
def test_a_producer_cannot_revive_a_stale_attempt(any_mq: Database, how: str) -> None:
    a, stale, msg = revived(any_mq)
    assert finish(a, how, stale) == "stale", "a later read of the message exists"
    assert message(any_mq, msg) == (1, True), "the producer's message is left alone"
    assert a.one("select pgfence_pgmq.set_vt(%s, '1 hour')", (stale,)) is None


def test_negative_control_judged_by_the_message_alone_a_stale_attempt_is_revived(
        mq: Database) -> None:
    mq.install_mutant("pgmq-finish-ignores-later-read")
    a, stale, msg = revived(mq)
    assert finish(a, "delete", stale) == "accepted"
    assert message(mq, msg) is None, "the stale attempt deleted the producer's message"


def test_negative_control_set_vt_judged_by_the_message_alone_keeps_a_revived_message(
        mq: Database) -> None:
    mq.install_mutant("pgmq-set-vt-ignores-later-read")
    a, stale, _ = revived(mq)
    assert a.one("select pgfence_pgmq.set_vt(%s, '1 hour')", (stale,)) is not None


# -- reads in flight on a protected queue when pgfence goes to 0.3.1 (its mark_lease reworked) ---

def protected_reads_across_the_core_upgrade(dbs: Databases,
                                            mutant: str | None = None) -> tuple[object, ...]:
    """Release 0.3.0 with its pgmq layer; queue jobs protected (enforce, consumers only) for r1;
    three messages read under r1's lease, which then expires. pgfence upgraded by file (the
    layer is unchanged: its 0.3.0 goes on, calling the reworked pgfence.mark_lease); the
    results of the reads made before: set_vt of one, archive of it, delete_many of the other
    two; then what the protection recorded and how many messages are left."""
    name = dbs.fresh("mqprot")
    install.prerequisites(dbs.cluster, name, ["pgmq"])
    dbs.install_release(name, "0.3.0")
    dbs.psql(name, "--single-transaction", "-f", RELEASES / "pgfence-pgmq--0.3.0.sql")
    db = Database(dbs.dsn(name))
    try:
        queue(db, 3)
        db.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'enforce', "
               "consumers_only => true)")
        w = db.session("before")
        lease = acquired(w.acquire("r1"))
        attempts = [a for a, _, _ in read(w, lease, 3)]
        # The lease runs out: the late results are authorized by their attempts (I5).
        db.sql("update pgfence.leases set expires_at = clock_timestamp() - interval '1 second' "
               "where lease_id = %s", (lease.lease_id,))
        dbs.upgrade_by_file(name, "0.3.0", ("pgmq",))
        assert dbs.version(name) == HEAD
        if mutant:
            db.install_mutant(mutant)
        after = db.session("after")
        kept = after.one("select pgfence_pgmq.set_vt(%s, '1 hour') is not null", (attempts[0],))
        one = finish(after, "archive", attempts[0])
        many = [str(o) for _, o in after.run(
            "select * from pgfence_pgmq.delete_many(%s::uuid[])", (attempts[1:],))]
        return (kept, one, many, int(db.one("select count(*) from pgfence.unfenced_writes")),
                int(db.one("select count(*) from pgmq.q_jobs")),
                int(db.one("select count(*) from pgmq.a_jobs")))
    finally:
        db.close()


def test_reads_on_a_protected_queue_finish_after_pgfence_is_upgraded(dbs: Databases) -> None:
    assert protected_reads_across_the_core_upgrade(dbs) == (
        True, "accepted", ["accepted", "accepted"], 0, 0, 1)


def test_negative_control_unmarked_results_are_refused_by_the_guard(dbs: Databases) -> None:
    with pytest.raises(psycopg.Error) as refused:
        protected_reads_across_the_core_upgrade(dbs, "mark-lease-marks-nothing")
    assert refused.value.sqlstate == "PF007", "the guard refused the write the mark would allow"

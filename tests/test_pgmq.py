"""The pgmq layer against the real pgmq (1.13, installed by scripts/setup), directly and
through PgBouncer in transaction mode: the scenarios of a worker fleet on a pgmq queue, each
with a negative control that breaks the mechanism it rests on and sees the scenario fail.

Time passing is simulated (pgfence_test.expire, expire_message); blocking is observed with
pg_blocking_pids(), never waited out.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database, Lease, Session, Step, sqlstate
from tests.support import PGMQ_SQL, ROOT, acquired
from tests.test_install import schema_dump


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
    mq.install_mutant("pgmq-finish-ignores-read-ct")
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


@pytest.mark.parametrize("missing", ["pgmq", "pgfence"])
def test_the_layer_refuses_without_what_it_needs(cluster: Cluster, missing: str) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    try:
        if missing != "pgmq":
            install.prerequisites(cluster, name, ["pgmq"])
        if missing != "pgfence":
            install.core(cluster, name)
        with pytest.raises(Exception, match=f"needs {missing}"):
            install.layer(cluster, name, "pgmq")
        assert cluster.psql(name, "-At", "-c",
                            "select count(*) from pg_proc where proname like 'pgmq\\_%'"
                            " and pronamespace::regnamespace::text = 'pgfence'").strip() == "0"
    finally:
        cluster.drop_database(name)


def test_sqitch_and_the_bundle_install_the_same_layer(
        cluster: Cluster, sqitch_template: Callable[[str], str]) -> None:
    by_sqitch, by_bundle = (f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    try:
        # by_sqitch: what `sqitch deploy` of the core made (a clone), then pgmq
        for name, template in ((by_sqitch, sqitch_template("")), (by_bundle, None)):
            cluster.create_database(name, template)
            install.prerequisites(cluster, name, ["pgmq"])
        subprocess.run(["sqitch", "deploy", f"db:pg:{by_sqitch}"], cwd=ROOT / "layers/pgmq",
                       check=True, capture_output=True)
        install.install(cluster, by_bundle, ["pgmq"], with_prerequisites=False)
        assert schema_dump(by_sqitch) == schema_dump(by_bundle)
        assert "pgfence_pgmq" in schema_dump(by_bundle)
        for step in (["verify"], ["revert", "-y"]):
            subprocess.run(["sqitch", *step, f"db:pg:{by_sqitch}"], cwd=ROOT / "layers/pgmq",
                           check=True, capture_output=True)
        gone = "select count(*) from pg_namespace where nspname = 'pgfence_pgmq'"
        assert cluster.psql(by_sqitch, "-At", "-c", gone).strip() == "0"
    finally:
        cluster.drop_database(by_sqitch)
        cluster.drop_database(by_bundle)


def test_the_layer_leaves_pgfences_fingerprint_alone(mq: Database, db: Database) -> None:
    # pgfence's next upgrade checks the schema against its release's fingerprint: the layer's
    # objects (schema pgfence_pgmq) must not make a database with the layer look changed by hand.
    query = (ROOT / "migrations/fingerprint.sql").read_text()
    assert mq.one(query) == db.one(query)
    assert mq.one("select count(*) from pg_proc "
                  "where pronamespace = 'pgfence_pgmq'::regnamespace") > 0


def test_negative_control_a_fingerprint_that_counts_the_layer(mq: Database, db: Database) -> None:
    query = (ROOT / "migrations/fingerprint.sql").read_text().replace(
        "p.pronamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace",
        "p.pronamespace::pg_catalog.regnamespace::pg_catalog.text like 'pgfence%'")
    assert mq.one(query) != db.one(query)

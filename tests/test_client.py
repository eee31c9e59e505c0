"""The reference client (pgfence.client): worker loop, renew deadline, fenced writes, drain on
SIGTERM, standby leaders. Directly and through PgBouncer."""

from __future__ import annotations

import math
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import pgfence.connection
from pgfence._core import Link, Op, Steps
from pgfence.client import Context, Leader, LeaseLost, Owner, Worker, drive
from pgfence.connection import connect
from testkit.cluster import Cluster, PgBouncer
from testkit.harness import HANG, Database
from tests.support import Clock, acquired


def test_worker_handles_the_queue_and_releases(any_db: Database) -> None:
    any_db.sql("select pgfence.register('w')")
    for n in range(5):
        any_db.sql("select pgfence.enqueue('q', %s)", (f'{{"n": {n}}}',))
    owner = Owner(any_db.dsn, "w", ttl=30)
    assert owner.acquire()
    Worker(owner, "q", lambda p, ctx: {"double": p["n"] * 2}, qty=2).run(max_tasks=5)
    assert any_db.sql("select state, count(*) from pgfence.tasks group by state") == [
        ("completed", 5)]
    assert any_db.one("select status from pgfence.lease_status") == "released"
    assert not owner.valid


def deadline_after_slow_renewal(db: Database, owner_cls: type[Owner]) -> tuple[float, bool]:
    db.sql("select pgfence.register('r')")
    clock = Clock()
    owner = owner_cls(db.dsn, "r", ttl=10, renew_every=3600, clock=clock)
    assert owner.acquire()
    clock.now = 105.0                        # renewal sent at 105, answered at 113

    def slow(op: Op) -> Any:
        rows = owner._perform(op)
        clock.now += 8.0
        return rows

    drive(slow, owner._renew(Link.OWNER))
    clock.now = 115.5                        # after sent + ttl, before answered + ttl
    valid = owner.valid
    owner.release()
    return owner.deadline, valid


def test_renew_deadline_is_measured_from_the_send(db: Database) -> None:
    assert deadline_after_slow_renewal(db, Owner) == (115.0, False)


class NaiveOwner(Owner):
    """Broken on purpose: the deadline counts from when the answer arrived."""

    def _renewed(self, sent: float, seq: int) -> None:
        super()._renewed(self.clock(), seq)


def test_negative_control_deadline_from_the_answer_stretches_the_lease(db: Database) -> None:
    until, valid = deadline_after_slow_renewal(db, NaiveOwner)
    assert until == 123.0 and valid


def test_refused_renewal_stops_claiming(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r')")
    any_db.sql("select pgfence.enqueue('q')")
    owner = Owner(any_db.dsn, "r", ttl=30, renew_every=3600)
    assert owner.acquire()
    assert owner.lease_id is not None
    any_db.expire(owner.lease_id)                     # the owner was paused ...
    any_db.sql("select pgfence.acquire('r', 'successor', '30 s')")
    with pytest.raises(psycopg.Error):
        owner.renew()
    assert not owner.valid and owner.lost and "refused" in owner.lost
    assert str(owner.lease_id) not in owner.lost      # a capability: never in a message
    assert owner.cancelled.is_set()
    worker = Worker(owner, "q", lambda p, ctx: p)
    worker.run()
    assert worker.handled == 0
    assert any_db.one("select state from pgfence.tasks") == "queued"


def test_fenced_write_after_takeover_raises_lease_lost(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r')")
    any_db.sql("create table ledger (note text)")
    any_db.sql("select pgfence.protect('ledger', 'r')")
    owner = Owner(any_db.dsn, "r", ttl=30, renew_every=3600)
    assert owner.acquire() and owner.lease_id is not None
    with connect(any_db.dsn, "fenced", autocommit=False) as conn:
        with owner.fenced(conn) as tx:
            tx.execute("insert into ledger values ('mine')")
        any_db.expire(owner.lease_id)
        any_db.sql("select pgfence.acquire('r', 'successor', '30 s')")
        owner._valid_until = float("inf")            # the owner does not know yet
        with pytest.raises(LeaseLost), owner.fenced(conn) as tx:
            tx.execute("insert into ledger values ('stale')")
    assert any_db.sql("select note from ledger") == [("mine",)]
    assert not owner.valid


def test_sigterm_drains_finishes_in_flight_and_releases(any_db: Database) -> None:
    any_db.sql("select pgfence.register('w')")
    for _ in range(3):
        any_db.sql("select pgfence.enqueue('q')")
    owner = Owner(any_db.dsn, "w", ttl=30, renew_every=3600)
    assert owner.acquire()
    worker = Worker(owner, "q", lambda p, ctx: signal.raise_signal(signal.SIGTERM), qty=1)
    previous = signal.getsignal(signal.SIGTERM)
    worker.install_sigterm()
    try:
        worker.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    # The task in hand when SIGTERM came was finished; nothing more was claimed.
    assert any_db.sql("select state, count(*) from pgfence.tasks group by state order by 1") == [
        ("completed", 1), ("queued", 2)]
    assert any_db.one("select status from pgfence.lease_status") == "released"


def worker_whose_drain_fails(db: Database, worker_cls: type[Worker]) -> Owner:
    db.sql("select pgfence.register('w')")
    db.install_mutant("drain-always-fails")
    owner = Owner(db.dsn, "w", ttl=30, renew_every=0.01)
    assert owner.acquire()
    with pytest.raises(psycopg.Error, match="drain is broken"):
        worker_cls(owner, "q", lambda p, ctx: p).run(max_tasks=0)
    return owner


def test_worker_releases_even_when_drain_fails(db: Database) -> None:
    owner = worker_whose_drain_fails(db, Worker)
    assert db.one("select status from pgfence.lease_status") == "released"
    assert owner._renewer is not None and not owner._renewer.is_alive()
    assert not owner.valid


class DrainThenRelease(Worker):
    """Broken on purpose: a failing drain skips the release."""

    def _leave(self) -> Steps[None]:
        yield from self.owner._drain()
        yield from self.owner._release()


def test_negative_control_failing_drain_leaves_the_lease_renewed(db: Database) -> None:
    owner = worker_whose_drain_fails(db, DrainThenRelease)
    assert db.one("select status from pgfence.lease_status") == "current"
    assert owner._renewer is not None and owner._renewer.is_alive()
    owner.release()


def test_standby_leader_takes_over_when_the_leader_leaves(any_db: Database) -> None:
    any_db.sql("select pgfence.register('control-plane')")
    first = Leader(Owner(any_db.dsn, "control-plane", owner="replica-1", ttl=30), 0.05)
    second = Leader(Owner(any_db.dsn, "control-plane", owner="replica-2", ttl=30), 0.05)
    stop = threading.Event()
    assert first.wait_for_leadership(stop)
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(second.wait_for_leadership(stop)))
    waiter.start()
    deadline = time.monotonic() + 30
    while second.polls < 3 and time.monotonic() < deadline:
        stop.wait(0.01)
    assert second.polls >= 3 and not result            # a standby while replica-1 leads
    first.owner.release()
    waiter.join(timeout=30)
    assert result == [True] and second.owner.valid
    assert any_db.one("select owner from pgfence.resource_status") == "replica-2"
    second.owner.release()


@dataclass
class HungHandler:
    owner: Owner
    worker: Worker
    attempts: list[uuid.UUID]               # what the handler was given (for expire_attempt)
    contexts: list[Context]
    unblock: threading.Event
    thread: threading.Thread
    errors: list[BaseException]

    def finish(self) -> None:
        """The handler returns at last; the worker reports its result and leaves."""
        self.unblock.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the worker did not finish"
        assert self.errors == []


@contextmanager
def handler_hung_past_its_deadline(db: Database, **options: Any) -> Iterator[HungHandler]:
    """A worker whose handler blocks on an Event the test controls; the owner's clock then
    moves past the handler's deadline (by default the task's visibility, 10 s), the lease's
    ttl (30 s) still ahead. Renewals run every 20 ms of real time."""
    db.sql("select pgfence.register('w')")
    db.sql("""select pgfence.enqueue('q', '{"n": 1}')""")
    clock = Clock()
    owner = Owner(db.dsn, "w", owner="hung", ttl=30, renew_every=0.02, clock=clock)
    assert owner.acquire()
    started, unblock = threading.Event(), threading.Event()
    attempts: list[uuid.UUID] = []
    contexts: list[Context] = []

    def handler(payload: Any, ctx: Context) -> Any:
        attempts.append(ctx.task.attempt_id)
        contexts.append(ctx)
        started.set()
        assert unblock.wait(60), "never unblocked"
        return {"n": payload["n"], "late": True}

    worker = Worker(owner, "q", handler, visibility=10, **options)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(max_tasks=1)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name="hung-worker")
    thread.start()
    try:
        assert started.wait(30), "the handler never started"
        clock.now += 11
        yield HungHandler(owner, worker, attempts, contexts, unblock, thread, errors)
    finally:
        unblock.set()
        thread.join(timeout=30)
        owner.release()


def lease_after_the_deadline(db: Database) -> str:
    """Generation 1's status once it has been either renewed after the deadline passed or
    taken out of `current`. Two rounds: one renewal decided before the clock moved may still
    land after it; a second one can only have been decided after."""
    for _ in range(2):
        since = db.one("select clock_timestamp()")
        db.wait_until("select status <> 'current' or renewed_at > %s "
                      "from pgfence.lease_status where generation = 1", (since,))
    return str(db.one("select status from pgfence.lease_status where generation = 1"))


@pytest.mark.parametrize("reclaimed, verdict", [(True, "stale"), (False, "accepted")],
                         ids=["successor-reclaimed-stale", "not-reclaimed-accepted"])
def test_hung_handler_past_its_deadline_gives_the_lease_up(
        db: Database, reclaimed: bool, verdict: str) -> None:
    with handler_hung_past_its_deadline(db) as hung:    # the default deadline: the visibility
        # Renewal stopped and the lease was drained while the handler still hangs.
        assert lease_after_the_deadline(db) == "draining"
        assert hung.owner._renewer is not None
        hung.owner._renewer.join(timeout=HANG)
        assert not hung.owner._renewer.is_alive()
        assert not hung.owner.valid and hung.owner.lost and "deadline" in hung.owner.lost
        # The handler was told: its context's cancellation signal is set, its time is up.
        (ctx,) = hung.contexts
        assert ctx.cancelled.is_set() and (ctx.remaining() or 0) < 0
        # A successor is admitted at once, not after the ttl.
        successor = db.session("successor")
        lease = acquired(successor.acquire("w"))
        assert lease.generation == 2
        if reclaimed:
            db.expire_attempt(hung.attempts[0])     # the hung attempt's visibility ran out
            successor.run("select pgfence.requeue_expired()")
            assert len(successor.run("select * from pgfence.claim(%s, 'q', 1, '30 s')",
                                     (lease.lease_id,))) == 1
        hung.finish()
        # The late result is judged by I5: stale once re-claimed, accepted otherwise.
        assert hung.worker.verdicts == Counter({verdict: 1})
        assert hung.worker.handled == 1
    assert db.sql("select generation, owner, status from pgfence.lease_status order by 1") == [
        (1, "hung", "released"), (2, "successor", "current")]
    # Never renewed after the drain, also not while the handler hung on.
    assert db.one("select coalesce(renewed_at, acquired_at) <= drained_at "
                  "from pgfence.lease_status where generation = 1")
    if reclaimed:
        assert db.sql("select state, attempt from pgfence.tasks") == [("claimed", 2)]
        assert db.one("select count(*) from pgfence.stale_results") == 1
    else:
        assert db.sql("select state, result from pgfence.tasks") == [
            ("completed", {"n": 1, "late": True})]


def test_negative_control_without_a_deadline_a_hung_handler_keeps_the_lease(
        db: Database) -> None:
    """The same hang with the deadline disabled: the renewer keeps the lease current."""
    with handler_hung_past_its_deadline(db, handler_timeout=math.inf) as hung:
        assert lease_after_the_deadline(db) == "current"
        assert hung.owner.valid
        (ctx,) = hung.contexts
        assert not ctx.cancelled.is_set() and ctx.deadline is None
        assert hung.owner._renewer is not None and hung.owner._renewer.is_alive()
        assert db.session("successor").acquire("w") is None
        hung.finish()
        assert hung.worker.verdicts == Counter({"accepted": 1})
    assert db.sql("select generation, status from pgfence.lease_status") == [(1, "released")]


# -- prepared statements -------------------------------------------------------------------

def prepared(conn: psycopg.Connection[Any]) -> list[str]:
    """The statements the server holds prepared for this connection's session."""
    return [s for (s,) in conn.execute("select statement from pg_prepared_statements "
                                       "order by statement").fetchall()]


def test_the_worker_prepares_its_statements_on_a_direct_connection(
        any_db: Database, cluster: Cluster) -> None:
    """Direct (over TCP and over the server's socket): the owner's and the worker's statements
    are prepared. Through PgBouncer in transaction mode: none is, and the worker works."""
    any_db.sql("select pgfence.register('w')")
    name = any_db.one("select current_database()")
    direct = not any_db.pooled
    dsns = [cluster.dsn(name), cluster.tcp_dsn(name)] if direct else [any_db.dsn]
    for n, dsn in enumerate(dsns):
        for i in range(4):
            any_db.sql("select pgfence.enqueue('q', %s)", (f'{{"n": {i}}}',))
        threshold, statements = prepared_by_a_worker(dsn)
        if direct:
            assert threshold == 0
            assert any("pgfence.claim(" in s for s in statements), statements
            assert any("pgfence.complete_many(" in s for s in statements), statements
        else:
            assert (threshold, statements) == (None, [])
        assert any_db.one("select count(*) from pgfence.tasks where state = 'completed'") == \
            4 * (n + 1)


def test_a_worker_role_detects_without_reading_what_it_may_not(
        db: Database, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A login role with pgfence_worker alone may not read unix_socket_directories (42501 for
    current_setting): detection (prepare=None) still connects, over TCP prepares (the server's
    own address and port), over the socket it cannot tell and does not. The negative control
    is the setting read unconditionally, as before: refused."""
    role = f"w_{uuid.uuid4().hex[:8]}"
    name = db.one("select current_database()")
    db.sql(f"create role {role} login in role pgfence_worker")
    try:
        def threshold(dsn: str) -> int | None:
            with connect(f"{dsn} user={role}", "detect", prepare=None) as conn:
                return conn.prepare_threshold
        assert threshold(cluster.tcp_dsn(name)) == 0
        assert threshold(cluster.dsn(name)) is None
        monkeypatch.setattr(pgfence.connection, "_ENDPOINT",
                            "select host(inet_server_addr()), inet_server_port(), "
                            "current_setting('port')::int, "
                            "current_setting('unix_socket_directories')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            threshold(cluster.dsn(name))
    finally:
        db.sql(f"drop role {role}")


def prepared_by_a_worker(dsn: str) -> tuple[int | None, list[str]]:
    """A worker's two batches of two: its WORK connection's prepare_threshold and what the
    server holds prepared for it, seen from the second batch's last handler."""
    owner = Owner(dsn, "w", ttl=30)
    assert owner.acquire()
    seen: list[tuple[int | None, list[str]]] = []
    workers: list[Worker] = []

    def handler(payload: Any, ctx: Context) -> None:
        # The worker's own connection, between its statements: the second batch sees what the
        # first one's claim and complete_many left prepared.
        work = workers[0]._links._conns[Link.WORK]
        seen.append((work.prepare_threshold, prepared(work)))

    workers.append(Worker(owner, "q", handler, qty=2))
    workers[0].run(max_tasks=4)
    return seen[-1]


def test_prepared_statements_through_a_transaction_pooler_fail(
        bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why they are detected: two clients of one transaction-mode pool, each preparing its
    statements (prepare=True), meet the other's on the server session they share: the second
    one's first statement has the name of the first one's (42P05). Asked to detect
    (prepare=None), neither prepares, and both work; with a detector that takes every
    connection for direct (the negative control), they fail again."""
    def two(prepare: bool | None) -> tuple[int, int]:
        with connect(bouncer.dsn("single"), "a", prepare=prepare) as a, \
                connect(bouncer.dsn("single"), "b", prepare=prepare) as b:
            x = a.execute("select %s::int + 1", (1,)).fetchone()
            y = b.execute("select %s::int * 3", (2,)).fetchone()
            assert x is not None and y is not None
            return int(x[0]), int(y[0])

    assert two(None) == (2, 6)
    with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
        two(True)
    monkeypatch.setattr(pgfence.connection, "direct", lambda info, endpoint: True)
    with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
        two(None)

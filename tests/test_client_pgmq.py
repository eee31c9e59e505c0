"""The fenced pgmq consumer of both Python clients (``PgmqWorker``), on the real pgmq and the
pgmq layer: each message handled once and archived (or deleted), a failure left to be read
again, a stale owner reads nothing, and no handler starts after its message's visibility ran
out (two resources, a handler that extends itself past its batch's hold; the negative control
is a worker that never looks)."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

import pgfence.aio
import pgfence.client
from testkit.harness import Database
from tests.support import KINDS, LONG, AnyContext, Client, Clock, acquired, client, later

VISIBILITY = 10.0           # each handler's time (no handler_timeout): a batch of 3 holds 30 s
SLOW = 35.0                 # the slow handler's time, in seconds of the test's time: longer
                            # than the batch's hold
# How long the slow handler extends its message: the extension must outlast SLOW and the
# other worker's real work meanwhile, on any machine.
EXTENSION = SLOW + LONG


def queue(db: Database, messages: int = 3, resources: tuple[str, ...] = ("r1",)) -> None:
    db.sql("select pgmq.create('jobs')")
    for r in resources:
        db.sql("select pgfence.register(%s)", (r,))
    for n in range(1, messages + 1):
        db.sql("select pgmq.send('jobs', %s::jsonb)", (f'{{"n": {n}}}',))


def pgmq_worker(c: Client, owner: Any, pre: Any, **kwargs: Any) -> Any:
    cls = pgfence.aio.PgmqWorker if c.aio else pgfence.client.PgmqWorker
    return c.worker(owner, "jobs", pre, cls=cls, effect=False, **kwargs)


def left(db: Database) -> tuple[int, int]:
    """(messages still queued, messages archived)."""
    return (db.one("select count(*) from pgmq.q_jobs"), db.one("select count(*) from pgmq.a_jobs"))


@pytest.mark.parametrize("finish", ["archive", "delete"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_message_is_handled_once_then_archived_or_deleted(
        any_mq: Database, kind: str, finish: str) -> None:
    db = any_mq
    queue(db)
    runs: Counter[tuple[int, int]] = Counter()
    with client(kind, db) as c:
        owner = c.owner(db.dsn, "r1", owner="w", ttl=300, renew_every=3600, clock=Clock())
        assert c.call(owner.acquire())
        worker = pgmq_worker(c, owner, lambda p, ctx: runs.update([(p["n"], ctx.task.attempt)]),
                             finish=finish)
        c.call(worker.run(until_idle=True))
    assert runs == Counter({(1, 1): 1, (2, 1): 1, (3, 1): 1})
    assert worker.verdicts == Counter({"accepted": 3}) and worker.failed == 0
    assert left(db) == ((0, 3) if finish == "archive" else (0, 0))


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_message_is_read_again_once_its_visibility_ran_out(
        mq: Database, kind: str) -> None:
    db = mq
    queue(db, messages=1)

    def fails_first(p: Any, ctx: AnyContext) -> None:
        if ctx.task.attempt == 1:
            raise RuntimeError("not yet")

    with client(kind, db) as c:
        owner = c.owner(db.dsn, "r1", owner="w", ttl=300, renew_every=3600, clock=Clock())
        assert c.call(owner.acquire())
        worker = pgmq_worker(c, owner, fails_first)
        c.call(worker.run(until_idle=True))
        assert worker.failed == 1 and sum(worker.verdicts.values()) == 0
        # Still queued, hidden for the rest of its visibility, its read counted.
        assert db.sql("select read_ct, vt > now() from pgmq.q_jobs") == [(1, True)]
        db.sql("update pgmq.q_jobs set vt = now()")
        # run released the lease as it left: the next run is the resource's next lease.
        again = c.owner(db.dsn, "r1", owner="w", ttl=300, renew_every=3600, clock=Clock())
        assert c.call(again.acquire())
        worker = pgmq_worker(c, again, fails_first)
        c.call(worker.run(until_idle=True))
    assert worker.verdicts == Counter({"accepted": 1}) and worker.failed == 0
    assert left(db) == (0, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_owner_reads_nothing(mq: Database, kind: str) -> None:
    db = mq
    queue(db)
    runs: list[int] = []
    with client(kind, db) as c:
        owner = c.owner(db.dsn, "r1", owner="old", ttl=300, renew_every=3600, clock=Clock())
        assert c.call(owner.acquire())
        # Paused past its lease; a successor holds r1. The old owner's clock has not moved, so
        # it still believes itself current: only the database can refuse it.
        db.expire(owner.lease_id)
        successor = db.session("new")
        acquired(successor.acquire("r1"))
        worker = pgmq_worker(c, owner, lambda p, ctx: runs.append(p["n"]))
        c.call(worker.run(until_idle=True))
    assert runs == [] and worker.handled == 0
    assert db.one("select max(read_ct) from pgmq.q_jobs") == 0


class Unchecked:
    """Broken on purpose: a message's visibility is never looked at."""

    budget: float

    def _needs_extension(self, held: Any, now: float) -> bool:
        return False

    def _deadline(self, held: Any, now: float) -> float | None:
        return now + self.budget


class NoExtension(Unchecked, pgfence.client.PgmqWorker):
    pass


class NoExtensionAsync(Unchecked, pgfence.aio.PgmqWorker):
    pass


def time_passes(db: Database, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    db.sql("update pgmq.q_jobs set vt = vt - make_interval(secs => %s)", (seconds,))
    db.sql("update pgfence.leases set expires_at = expires_at - make_interval(secs => %s) "
           "where state = 'active'", (seconds,))


def two_resources_one_slow_handler(db: Database, kind: str, broken: bool
                                   ) -> tuple[Counter[tuple[str, int]], Any]:
    queue(db, resources=("r1", "r2"))
    runs: Counter[tuple[str, int]] = Counter()
    with client(kind, db) as c:
        clocks = {"r1": Clock(), "r2": Clock()}
        owners = {r: c.owner(db.dsn, r, owner=f"{r}-worker", ttl=300, renew_every=3600,
                             clock=clocks[r]) for r in clocks}
        for owner in owners.values():
            assert c.call(owner.acquire())
        other = pgmq_worker(c, owners["r2"], lambda p, ctx: runs.update([("r2", p["n"])]),
                            visibility=VISIBILITY)

        def meanwhile() -> Any:
            time_passes(db, clocks["r1"], SLOW)
            return other.run(until_idle=True)

        def slow(p: Any, ctx: AnyContext) -> Any:
            runs["r1", p["n"]] += 1
            if sum(n for (r, _), n in runs.items() if r == "r1") > 1:
                return None
            # The first handler is slow: it extends its message, then runs past its batch's
            # hold.
            if c.aio:
                async def extended() -> None:
                    assert await cast(pgfence.aio.Context, ctx).extend(EXTENSION) is not None
                    await later(meanwhile())
                return extended()
            assert ctx.extend(EXTENSION) is not None
            return meanwhile()

        cls = (NoExtensionAsync if c.aio else NoExtension) if broken else None
        worker = (c.worker(owners["r1"], "jobs", slow, cls=cls, effect=False, qty=3,
                           visibility=VISIBILITY) if cls
                  else pgmq_worker(c, owners["r1"], slow, qty=3, visibility=VISIBILITY))
        c.call(worker.run(until_idle=True))
    assert left(db) == (0, 3)
    return runs, worker


@pytest.mark.parametrize("kind", KINDS)
def test_two_resources_and_a_slow_handler_every_message_handled_once(
        mq: Database, kind: str) -> None:
    runs, worker = two_resources_one_slow_handler(mq, kind, broken=False)
    assert runs == Counter({("r1", 1): 1, ("r2", 2): 1, ("r2", 3): 1})
    assert worker.skipped == 2 and worker.verdicts == Counter({"accepted": 1})


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_a_pgmq_worker_blind_to_visibility_handles_twice(
        mq: Database, kind: str) -> None:
    runs, worker = two_resources_one_slow_handler(mq, kind, broken=True)
    assert runs == Counter({("r1", 1): 1, ("r1", 2): 1, ("r1", 3): 1,
                            ("r2", 2): 1, ("r2", 3): 1})
    assert worker.verdicts == Counter({"accepted": 1, "stale": 2})

"""The handler's context (the task, its deadline, cancelled, extend), and the asyncio client's
Owner, Worker and Leader beside the threaded one's (tests/test_client.py holds the rest of the
threaded client's)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

import pgfence.aio
from pgfence.aio import LeaseLost
from pgfence.connection import aconnect
from testkit.harness import Database
from tests.support import KINDS, AnyContext, Clock, client


@pytest.mark.parametrize("kind", KINDS)
def test_the_context_holds_the_task_its_deadline_and_extend(db: Database, kind: str) -> None:
    db.sql("select pgfence.register('w')")
    db.sql("""select pgfence.enqueue('q', '{"n": 7}')""")
    clock = Clock()
    seen: dict[str, Any] = {}

    def pre(payload: Any, ctx: AnyContext) -> Any:
        seen.update(task=ctx.task, deadline=ctx.deadline, remaining=ctx.remaining(),
                    visible=db.one("select visible_until from pgfence.tasks"))

        async def extend_async() -> None:
            seen["extended"] = await ctx.extend(50)   # type: ignore[misc]
            seen["deadline_after"] = ctx.deadline

        if c.aio:
            return extend_async()
        seen["extended"] = ctx.extend(50)
        seen["deadline_after"] = ctx.deadline
        return None

    with client(kind, db) as c:
        owner = c.owner(db.dsn, "w", ttl=30, renew_every=3600, clock=clock)
        assert c.call(owner.acquire())
        worker = c.worker(owner, "q", pre, effect=False, visibility=20)
        c.call(worker.run(max_tasks=1))
    task = seen["task"]
    assert (task.task_id, task.attempt, task.payload) == db.sql(
        "select task_id, attempt, payload from pgfence.tasks")[0]
    assert isinstance(task.attempt_id, uuid.UUID) and str(task.attempt_id) not in repr(task)
    # The attempt id is the one that completed the task: sent again, it is a duplicate.
    assert db.one("select pgfence.complete(%s)", (task.attempt_id,)) == "duplicate"
    # The deadline is the claim's visibility, on the owner's clock (which stood still)...
    assert (seen["deadline"], seen["remaining"]) == (100 + 20, 20)
    # ... and extend() kept the task 50 s more, moving the deadline with it.
    assert seen["extended"] > seen["visible"]
    assert seen["deadline_after"] == 100 + 50


@pytest.mark.parametrize("superseded", [True, False], ids=["superseded", "control-held"])
@pytest.mark.parametrize("kind", KINDS)
def test_extend_answers_none_once_another_attempt_holds_the_task(
        db: Database, kind: str, superseded: bool) -> None:
    """A handler learns from extend() that its task went to someone else; the control: the
    same handler, its task still its own, gets a new visibility end."""
    db.sql("select pgfence.register('w'); select pgfence.register('other')")
    db.sql("""select pgfence.enqueue('q', '{"n": 1}')""")
    other = db.session("other")
    extended: list[Any] = []

    def pre(payload: Any, ctx: AnyContext) -> Any:
        if superseded:               # its visibility ran out, and another resource claimed it
            db.expire_attempt(ctx.task.attempt_id)
            lease = other.acquire("other")
            assert lease is not None
            other.run("select pgfence.requeue_expired()")
            assert len(other.run("select * from pgfence.claim(%s, 'q')", (lease.lease_id,))) == 1

        async def extend_async() -> None:
            extended.append(await ctx.extend(10))   # type: ignore[misc]
        if c.aio:
            return extend_async()
        extended.append(ctx.extend(10))
        return None

    with client(kind, db) as c:
        owner = c.owner(db.dsn, "w", ttl=30, renew_every=3600)
        assert c.call(owner.acquire())
        worker = c.worker(owner, "q", pre, effect=False)
        c.call(worker.run(max_tasks=1))
    if superseded:
        assert extended == [None] and worker.verdicts == Counter({"stale": 1})
    else:
        assert extended[0] is not None and worker.verdicts == Counter({"accepted": 1})


@pytest.mark.parametrize("key", ["task_id", "attempt_id"],
                         ids=["by-task-id", "negative-control-by-attempt-id"])
def test_the_task_id_keys_an_external_effect_across_attempts(db: Database, key: str) -> None:
    """docs/guarantees.md: key external effects by the task id. A task whose first attempt's
    visibility ran out runs again; an effect keyed by task id happens once, one keyed by
    attempt id twice."""
    db.sql("select pgfence.register('w'); select pgfence.register('other')")
    db.sql("""select pgfence.enqueue('q', '{"n": 1}')""")
    sent: set[Any] = set()
    with client("sync", db) as c:
        owners = [c.owner(db.dsn, r, ttl=30, renew_every=3600) for r in ("w", "other")]
        assert all(o.acquire() for o in owners)

        def pre(payload: Any, ctx: AnyContext) -> None:
            sent.add(getattr(ctx.task, key))     # the receiver keeps one effect per key
            if ctx.task.attempt == 1:            # then the first attempt's time runs out,
                db.expire_attempt(ctx.task.attempt_id)    # and another replica runs it again
                c.worker(owners[1], "q", pre, effect=False).run(until_idle=True)

        worker = c.worker(owners[0], "q", pre, effect=False)
        worker.run(until_idle=True)
    assert worker.verdicts == Counter({"stale": 1})
    assert len(sent) == (1 if key == "task_id" else 2)


@pytest.mark.parametrize("timeout", [None, float("inf")], ids=["deadline", "negative-control-none"])
def test_an_async_handler_past_its_deadline_is_cancelled(db: Database, timeout: float | None
                                                          ) -> None:
    """The asyncio client: a handler still running at its deadline finds ``cancelled`` set,
    and its lease drained, while it runs; with no deadline, renewals go on instead."""
    db.sql("select pgfence.register('w')")
    db.sql("""select pgfence.enqueue('q', '{"n": 1}')""")
    clock = Clock()
    seen: list[Any] = []

    async def handler(payload: Any, ctx: pgfence.aio.Context) -> Any:
        clock.now += 11                      # past its deadline (the visibility, 10 s)
        if timeout is None:
            await asyncio.wait_for(ctx.cancelled.wait(), 30)
        else:                                # two renewals land after the clock moved
            for _ in range(2):
                since = db.one("select clock_timestamp()")
                await asyncio.to_thread(db.wait_until, "select renewed_at > %s "
                                        "from pgfence.lease_status", (since,))
        seen.append((ctx.cancelled.is_set(), ctx.deadline,
                     db.one("select status from pgfence.lease_status")))
        return {"late": True}

    async def main() -> pgfence.aio.Worker:
        owner = pgfence.aio.Owner(db.dsn, "w", ttl=30, renew_every=0.02, clock=clock)
        assert await owner.acquire()
        worker = pgfence.aio.Worker(owner, "q", handler, visibility=10, handler_timeout=timeout)
        await worker.run(max_tasks=1)
        return worker

    worker = asyncio.run(main())
    if timeout is None:
        assert seen == [(True, 110, "draining")]
    else:
        assert seen == [(False, None, "current")]
    # Its late result is accepted: nobody re-claimed the task.
    assert worker.verdicts == Counter({"accepted": 1})
    assert db.one("select status from pgfence.lease_status") == "released"


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_async_fenced_write_after_takeover_raises_lease_lost(
        request: pytest.FixtureRequest, db: Database, via: str) -> None:
    db.sql("select pgfence.register('r')")
    db.sql("create table ledger (note text)")
    db.sql("select pgfence.protect('ledger', 'r')")
    dsn = db.dsn
    if via == "pgbouncer":
        dsn = request.getfixturevalue("bouncer").dsn(db.one("select current_database()"))

    async def main() -> None:
        owner = pgfence.aio.Owner(dsn, "r", ttl=30, renew_every=3600)
        assert await owner.acquire() and owner.lease_id is not None
        conn = await aconnect(dsn, "fenced", autocommit=False)
        try:
            async with owner.fenced(conn) as tx:
                await tx.execute("insert into ledger values ('mine')")
            db.expire(owner.lease_id)
            db.sql("select pgfence.acquire('r', 'successor', '30 s')")
            owner._valid_until = float("inf")        # the owner does not know yet
            with pytest.raises(LeaseLost, match="fence refused") as refused:
                async with owner.fenced(conn) as tx:
                    await tx.execute("insert into ledger values ('stale')")
            assert str(owner.lease_id) not in str(refused.value)
            assert not owner.valid and owner.cancelled.is_set()
        finally:
            await conn.close()
            await owner.release()

    asyncio.run(main())
    assert db.sql("select note from ledger") == [("mine",)]


def test_async_standby_leader_takes_over_when_the_leader_leaves(db: Database) -> None:
    db.sql("select pgfence.register('control-plane')")

    async def main() -> None:
        first = pgfence.aio.Leader(pgfence.aio.Owner(db.dsn, "control-plane", owner="replica-1"),
                                   0.01)
        second = pgfence.aio.Leader(pgfence.aio.Owner(db.dsn, "control-plane",
                                                      owner="replica-2"), 0.01)
        stop = asyncio.Event()
        assert await first.wait_for_leadership(stop)
        waiting = asyncio.create_task(second.wait_for_leadership(stop))
        while second.polls < 3:
            await asyncio.sleep(0.01)
        assert not waiting.done()                    # a standby while replica-1 leads
        await first.owner.release()
        assert await asyncio.wait_for(waiting, 30) and second.owner.valid
        await second.owner.release()

    asyncio.run(main())
    assert db.sql("select owner, status from pgfence.lease_status order by generation") == [
        ("replica-1", "released"), ("replica-2", "released")]


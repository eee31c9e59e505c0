"""No handler starts after its task's visibility ran out (both clients).

A claim holds its batch for the batch: ``qty`` handlers' time, so that handlers within their
deadlines need no extend. Two resources serve one queue; the worker of r1 has a handler that
runs past that hold, extending its own task as it goes (it shows progress). While it runs,
time passes (its owner's fake clock and the database's visibility and lease times move on
together, by the test's hand), and the worker of r2 requeues what ran out and handles it.
Every handler must run once: the rest of r1's batch, found stale when extended before its
handler, is skipped. The negative control is the client as it was: a task's visibility never
looked at before its handler, and handlers run twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

import pgfence._core
import pgfence.aio
import pgfence.client
from pgfence._core import Call, Op, Together
from testkit.harness import Database
from tests.support import KINDS, LONG, AnyContext, Client, Clock, client, later

VISIBILITY = 10.0           # each handler's time (no handler_timeout): a batch of 3 holds 30 s
SLOW = 35.0                 # how long the slow handler takes, in seconds of the test's time:
                            # longer than the batch's hold
# How long the slow handler extends its task: the extension must outlast SLOW and the other
# worker's real work meanwhile, on any machine.
EXTENSION = SLOW + LONG


class Unchecked:
    """Broken on purpose, as the client was: a task's visibility is never looked at; each
    handler gets its full time from its start."""

    budget: float

    def _needs_extension(self, held: Any, now: float) -> bool:
        return False

    def _deadline(self, held: Any, now: float) -> float | None:
        return now + self.budget


class NoExtension(Unchecked, pgfence.client.Worker):
    pass


class NoExtensionAsync(Unchecked, pgfence.aio.Worker):
    pass


def steps_of(op: Op) -> list[str]:
    """The steps of the statements an operation sends (a results' statement and the claim it
    rides with: both)."""
    return [op.step] if isinstance(op, Call) else \
        [c.step for c in op.calls] if isinstance(op, Together) else []


class Recording(pgfence.client.Worker):
    """A worker that notes the step of each statement it sends, and which went together."""

    steps: list[str]
    sends: list[list[str]]

    def _perform(self, op: Op) -> Any:
        if steps := steps_of(op):
            self.steps += steps
            self.sends.append(steps)
        return super()._perform(op)


class RecordingAsync(pgfence.aio.Worker):
    steps: list[str]
    sends: list[list[str]]

    async def _perform(self, op: Op) -> Any:
        if steps := steps_of(op):
            self.steps += steps
            self.sends.append(steps)
        return await super()._perform(op)


class HeldForOne:
    """Broken on purpose, as the client was: a claim holds its batch for one handler's time."""

    visibility: float

    @property
    def hold(self) -> float:
        return self.visibility


class HeldForOneRecording(HeldForOne, Recording):
    pass


class HeldForOneRecordingAsync(HeldForOne, RecordingAsync):
    pass


def time_passes(db: Database, clock: Clock, seconds: float) -> None:
    clock.now += seconds
    db.sql("update pgfence.tasks set visible_until = visible_until - make_interval(secs => %s) "
           "where state = 'claimed'", (seconds,))
    db.sql("update pgfence.leases set expires_at = expires_at - make_interval(secs => %s) "
           "where state = 'active'", (seconds,))


def two_resources_one_slow_handler(db: Database, c: Client, qty: int,
                                   broken: bool = False
                                   ) -> tuple[Counter[tuple[str, int]], Any, list[float | None]]:
    """Handler calls by (resource, task), r1's worker, and the time its slow handler had left
    after its work."""
    for r in ("r1", "r2"):
        db.sql("select pgfence.register(%s)", (r,))
    for n in (1, 2, 3):
        db.sql("select pgfence.enqueue('q', %s)", (f'{{"n": {n}}}',))
    clocks = {"r1": Clock(), "r2": Clock()}
    owners = {r: c.owner(db.dsn, r, owner=f"{r}-worker", ttl=300, renew_every=3600,
                         clock=clocks[r]) for r in clocks}
    for owner in owners.values():
        assert c.call(owner.acquire())
    runs: Counter[tuple[str, int]] = Counter()
    remaining: list[float | None] = []

    def fast(payload: Any, ctx: AnyContext) -> None:
        runs["r2", ctx.task.task_id] += 1

    other = c.worker(owners["r2"], "q", fast, effect=False, visibility=VISIBILITY)

    def meanwhile(ctx: AnyContext) -> Any:
        time_passes(db, clocks["r1"], SLOW)
        remaining.append(ctx.remaining())
        # Meanwhile the other resource's worker serves the queue (until it is idle); an
        # asyncio handler awaits it.
        return other.run(until_idle=True)

    def slow(payload: Any, ctx: AnyContext) -> Any:
        runs["r1", ctx.task.task_id] += 1
        if sum(n for (r, _), n in runs.items() if r == "r1") > 1:
            return None
        # The first handler is slow: it extends its task, then runs past its batch's hold.
        if c.aio:
            async def extended() -> None:
                assert await cast(pgfence.aio.Context, ctx).extend(EXTENSION) is not None
                await later(meanwhile(ctx))
            return extended()
        assert ctx.extend(EXTENSION) is not None
        return meanwhile(ctx)

    cls: type[Any] | None = (NoExtensionAsync if c.aio else NoExtension) if broken else None
    worker = c.worker(owners["r1"], "q", slow, cls=cls, effect=False, qty=qty,
                      visibility=VISIBILITY)
    c.call(worker.run(until_idle=True))
    assert db.sql("select state, count(*) from pgfence.tasks group by 1") == [("completed", 3)]
    return runs, worker, remaining


@pytest.mark.parametrize("qty", [3, 1], ids=["batch-of-3", "one-at-a-time"])
@pytest.mark.parametrize("kind", KINDS)
def test_two_resources_and_a_slow_handler_every_handler_runs_once(
        db: Database, kind: str, qty: int) -> None:
    with client(kind, db) as c:
        runs, worker, remaining = two_resources_one_slow_handler(db, c, qty)
    # r2 took what r1 had not begun: the rest of r1's batch had run out with its hold.
    assert runs == Counter({("r1", 1): 1, ("r2", 2): 1, ("r2", 3): 1})
    (left,) = remaining
    assert left == pytest.approx(EXTENSION - SLOW)       # its deadline moved with the extend
    assert worker.skipped == (2 if qty == 3 else 0)      # the batch's rest: stale by then
    assert worker.verdicts == Counter({"accepted": 1})
    assert db.one("select count(*) from pgfence.stale_results") == 0


def batch_of_five(db: Database, kind: str, takes: float, broken: bool = False, **kwargs: Any
                  ) -> tuple[list[tuple[int, float | None]], Any]:
    """Five tasks claimed as one batch by a worker whose handlers each take ``takes`` seconds
    of the test's time: (task, time its handler had left at its start), and the worker."""
    db.sql("select pgfence.register('r')")
    for n in range(1, 6):
        db.sql("select pgfence.enqueue('q', %s)", (f'{{"n": {n}}}',))
    clock = Clock()
    calls: list[tuple[int, float | None]] = []
    with client(kind, db) as c:
        owner = c.owner(db.dsn, "r", owner="w", ttl=600, renew_every=3600, clock=clock)
        assert c.call(owner.acquire())

        def busy(payload: Any, ctx: AnyContext) -> None:
            calls.append((ctx.task.task_id, ctx.remaining()))
            time_passes(db, clock, takes)

        cls = ((HeldForOneRecordingAsync if c.aio else HeldForOneRecording) if broken
               else (RecordingAsync if c.aio else Recording))
        worker = c.worker(owner, "q", busy, cls=cls, effect=False, qty=5,
                          visibility=VISIBILITY, **kwargs)
        worker.steps, worker.sends = [], []
        c.call(worker.run(until_idle=True))
    assert [t for t, _ in calls] == [1, 2, 3, 4, 5]
    assert worker.verdicts == Counter({"accepted": 5})
    assert db.one("select count(*) from pgfence.tasks where state = 'completed'") == 5
    return calls, worker


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_of_handlers_within_their_deadlines_is_never_extended(
        db: Database, kind: str) -> None:
    """The claim's hold is the batch's: handlers that each take nearly all their time need no
    extend. (Their results are held for the batch here, report_within: the next test.)"""
    calls, worker = batch_of_five(db, kind, VISIBILITY - 0.5, report_within=5 * VISIBILITY)
    assert all(left == pytest.approx(VISIBILITY, abs=0.5) for _, left in calls), calls
    # One claim, no extend, one statement for the five results; then the empty queue.
    assert worker.steps == ["claim", "complete_many", "claim", "requeue", "drain", "release"]


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_a_claim_held_for_one_handler_extends_the_rest(
        db: Database, kind: str) -> None:
    _, worker = batch_of_five(db, kind, VISIBILITY - 0.5, broken=True,
                              report_within=5 * VISIBILITY)
    assert worker.steps == ["claim", *["extend"] * 4, "complete_many", "claim", "requeue",
                            "drain", "release"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_batchs_results_wait_for_it_at_most_report_within(db: Database, kind: str) -> None:
    """Quick handlers: the five results in one statement once the batch is done."""
    _, worker = batch_of_five(db, kind, 0.0)
    assert worker.steps == ["claim", "complete_many", "claim", "requeue", "drain", "release"]
    # The results ride with the next claim: one round trip, one transaction.
    assert worker.sends == [["claim"], ["complete_many", "claim"], ["requeue"], ["drain"],
                            ["release"]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_result_waits_no_longer_than_report_within(db: Database, kind: str) -> None:
    """Handlers that take longer than report_within: each result is sent before the next
    handler starts."""
    _, worker = batch_of_five(db, kind, 2.0, report_within=1.0)
    assert worker.steps == ["claim", *["complete"] * 5, "claim", "requeue", "drain", "release"]


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_a_batch_without_extension_runs_handlers_twice(
        db: Database, kind: str) -> None:
    with client(kind, db) as c:
        runs, worker, _ = two_resources_one_slow_handler(db, c, qty=3, broken=True)
    # The rest of the batch ran out while the slow handler ran: r2 handled them, and r1 then
    # ran each of them again, its results refused as stale.
    assert runs == Counter({("r1", 1): 1, ("r1", 2): 1, ("r1", 3): 1,
                            ("r2", 2): 1, ("r2", 3): 1})
    assert worker.verdicts == Counter({"accepted": 1, "stale": 2})


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_longer_than_a_day_claims_with_a_days_hold(
        db: Database, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten handlers of three hours each: the batch's hold would be 30 hours, more than the
    longest visibility pgfence takes (22023). The claim asks for a day; the negative control,
    the hold without that bound, is refused, and the worker stops with its task unclaimed."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q', '{\"n\": 1}')")
    with client(kind, db) as c:
        owner = c.owner(db.dsn, "r", owner="w", ttl=600, renew_every=3600)
        assert c.call(owner.acquire())
        worker = c.worker(owner, "q", lambda payload, ctx: None, effect=False, qty=10,
                          handler_timeout=3 * 3600)
        assert worker.hold == pgfence._core.DAY
        c.call(worker.run(until_idle=True))
        assert db.one("select count(*) from pgfence.tasks where state = 'completed'") == 1
        monkeypatch.setattr(pgfence._core, "DAY", float("inf"))
        assert worker.hold == 30 * 3600
        db.sql("select pgfence.enqueue('q', '{\"n\": 1}')")
        c.call(worker.run(until_idle=True))       # its claim refused (22023): the worker stops
        assert not owner.valid
        assert db.one("select count(*) from pgfence.tasks where state = 'queued'") == 1

"""No handler starts after its task's visibility ran out (both clients).

Two resources serve one queue; the worker of r1 has a handler slower than the claim's
visibility. While it runs, time passes (its owner's fake clock and the database's visibility
and lease times move on together, by the test's hand), and the worker of r2 requeues what ran
out and handles it. Every handler must run once: the slow one's task was extended before it
started, and the rest of its batch, found stale, is skipped. The negative control is the
client as it was: a batch of three, nothing extended, and handlers run twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import pgfence.aio
import pgfence.client
from testkit.harness import Database
from tests.support import KINDS, LONG, AnyContext, Client, Clock, client

SLOW = 15.0                 # how long the slow handler takes, in seconds of the test's time
VISIBILITY = 10.0           # shorter than that
# The handler's deadline: sized for it, with LONG to spare. The task it extends is held in
# the database that long from the extend, less SLOW when time passes: what is left must
# outlast the other worker's real work meanwhile, on any machine (it was 5 s, of which that
# work took 1.4 s at 2 % of a CPU).
TIMEOUT = SLOW + LONG


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

    def slow(payload: Any, ctx: AnyContext) -> Any:
        runs["r1", ctx.task.task_id] += 1
        if sum(n for (r, _), n in runs.items() if r == "r1") == 1:
            time_passes(db, clocks["r1"], SLOW)      # the first handler is slow
            remaining.append(ctx.remaining())
            # Meanwhile the other resource's worker serves the queue (until it is idle); an
            # asyncio handler awaits it.
            return other.run(until_idle=True)
        return None

    cls: type[Any] | None = (NoExtensionAsync if c.aio else NoExtension) if broken else None
    worker = c.worker(owners["r1"], "q", slow, cls=cls, effect=False, qty=qty,
                      visibility=VISIBILITY, handler_timeout=TIMEOUT)
    c.call(worker.run(until_idle=True))
    assert db.sql("select state, count(*) from pgfence.tasks group by 1") == [("completed", 3)]
    return runs, worker, remaining


@pytest.mark.parametrize("qty", [3, 1], ids=["batch-of-3", "one-at-a-time"])
@pytest.mark.parametrize("kind", KINDS)
def test_two_resources_and_a_slow_handler_every_handler_runs_once(
        db: Database, kind: str, qty: int) -> None:
    with client(kind, db) as c:
        runs, worker, remaining = two_resources_one_slow_handler(db, c, qty)
    # The slow handler's task was extended before it started; r2 took what r1 had not begun.
    assert runs == Counter({("r1", 1): 1, ("r2", 2): 1, ("r2", 3): 1})
    (left,) = remaining
    assert left == pytest.approx(TIMEOUT - SLOW)          # still within its deadline
    assert worker.skipped == (2 if qty == 3 else 0)      # the batch's rest: stale by then
    assert worker.verdicts == Counter({"accepted": 1})
    assert db.one("select count(*) from pgfence.stale_results") == 0


@pytest.mark.parametrize("kind", KINDS)
def test_negative_control_a_batch_without_extension_runs_handlers_twice(
        db: Database, kind: str) -> None:
    with client(kind, db) as c:
        runs, worker, _ = two_resources_one_slow_handler(db, c, qty=3, broken=True)
    # Every task of the batch ran out while the slow handler ran: r2 handled all three, and r1
    # then ran each of them again, its results refused as stale.
    assert runs == Counter({("r1", 1): 1, ("r1", 2): 1, ("r1", 3): 1,
                            ("r2", 1): 1, ("r2", 2): 1, ("r2", 3): 1})
    assert worker.verdicts == Counter({"stale": 3})

"""The client's rules alone (pgfence._core), without a database: the backoff, what a failure
is, the steps of a report and a claim when their connection is lost, and of a batch's results
that ride with the next claim. The same steps run against real faults in
tests/test_client_faults.py."""

from __future__ import annotations

import random
import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgfence._core import (
    Call,
    Failure,
    Held,
    Retry,
    Sleep,
    Steps,
    Task,
    Together,
    classify,
    redact,
)
from pgfence.client import Owner, Worker


class NoJitter(Retry):
    """Broken on purpose: every worker waits the same (they come back in step)."""

    def delay(self, n: int) -> float:
        return self.bound(n)


class NoCap(Retry):
    """Broken on purpose: the pauses grow without bound."""

    def bound(self, n: int) -> float:
        return self.base * 2.0 ** n


def backoff_faults(retry: Retry, n: int = 12, draws: int = 200) -> list[str]:
    """What is wrong with ``retry``'s pauses before the n-th retry, as sentences."""
    delays = [retry.delay(n) for _ in range(draws)]
    faults = []
    if any(d > retry.cap for d in delays):
        faults.append("above the cap")
    if any(d < 0 for d in delays):
        faults.append("negative")
    if len(set(delays)) < draws // 2:
        faults.append("not jittered")
    if max(delays) < retry.cap / 2:       # full jitter spreads over [0, cap] once capped
        faults.append("not spread up to the cap")
    return faults


def test_backoff_is_capped_and_fully_jittered() -> None:
    assert backoff_faults(Retry(rng=random.Random(1))) == []


def test_negative_control_backoff_without_jitter_or_cap() -> None:
    assert backoff_faults(NoJitter(rng=random.Random(1))) == ["not jittered"]
    assert "above the cap" in backoff_faults(NoCap(rng=random.Random(1)))


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=2**32))
def test_every_pause_is_within_its_bound(n: int, seed: int) -> None:
    retry = Retry(base=0.1, cap=10.0, rng=random.Random(seed))
    assert 0 <= retry.delay(n) <= min(10.0, 0.1 * 2 ** n)


def error(sqlstate: str | None, cls: type[psycopg.Error] = psycopg.OperationalError
          ) -> psycopg.Error:
    e = cls("boom")
    if sqlstate is not None:
        e.sqlstate = sqlstate
    return e


@pytest.mark.parametrize("e, failure", [
    (error(None), Failure.CONNECTION),                      # the server closed the connection
    (error(None, psycopg.InterfaceError), Failure.CONNECTION),   # the connection is closed
    (psycopg.errors.AdminShutdown("57P01"), Failure.CONNECTION),  # pg_terminate_backend
    (error("08006"), Failure.CONNECTION),
    (psycopg.errors.DeadlockDetected("40P01"), Failure.ROLLED_BACK),
    (psycopg.errors.SerializationFailure("40001"), Failure.ROLLED_BACK),
    (psycopg.errors.LockNotAvailable("55P03"), Failure.ROLLED_BACK),   # a bounded lock wait
    (error("PF001", psycopg.errors.RaiseException), Failure.REFUSED),
    (psycopg.errors.UniqueViolation("23505"), Failure.OTHER),
    (psycopg.errors.QueryCanceled("57014"), Failure.OTHER),   # a statement_timeout: not guessed
    (ValueError("not the database's"), Failure.OTHER),
])
def test_what_a_failure_is(e: BaseException, failure: Failure) -> None:
    assert classify(e) is failure


def test_ids_are_kept_out_of_messages() -> None:
    lease = uuid.uuid4()
    assert redact(f"pgfence: lease {lease} is not current (superseded)") == \
        "pgfence: lease … is not current (superseded)"


def worker(**kwargs: Any) -> tuple[Owner, Worker, Held]:
    owner = Owner("", "r", ttl=30, retry=Retry(base=0.001, cap=0.001))
    owner.lease_id, owner.generation = uuid.uuid4(), 1
    task = Task(1, uuid.uuid4(), 1, {})
    return owner, Worker(owner, "q", lambda p, ctx: p, **kwargs), Held(task, 0.0, 30.0, True)


def test_a_lost_report_is_sent_again_with_the_same_attempt_and_its_verdict_taken() -> None:
    owner, core, held = worker()
    steps = core._report(held, "complete", {"ok": True})
    first = next(steps)
    assert isinstance(first, Call) and first.step == "complete"
    assert isinstance(steps.throw(error(None)), Sleep)       # the answer was lost: back off
    again = next(steps)
    assert again == first                                   # the same statement, same attempt
    with pytest.raises(StopIteration) as done:
        steps.send([("duplicate",)])
    assert done.value.value == "duplicate" and core.verdicts["duplicate"] == 1
    assert not owner.confirmed                              # a connection was lost: doubted


def test_a_lost_claim_is_not_sent_again() -> None:
    owner, core, _ = worker()
    owner._valid_until, owner._stopping = float("inf"), False
    steps = core._claim()
    assert isinstance(next(steps), Call)
    with pytest.raises(StopIteration) as done:
        steps.throw(error(None))
    assert done.value.value is None and not owner.confirmed


def test_a_rolled_back_claim_is_sent_again() -> None:
    owner, core, _ = worker()
    owner._valid_until = float("inf")
    steps = core._claim()
    first = next(steps)
    assert isinstance(steps.throw(psycopg.errors.DeadlockDetected("40P01")), Sleep)
    assert next(steps) == first and owner.confirmed          # no connection was lost


def test_a_report_refused_after_its_bounded_lock_wait_is_sent_again() -> None:
    """A layer's result waits for its run or its message at most 5 s, then 55P03: the same
    report is sent again after a pause (the holder's idle time is bounded too)."""
    owner, core, held = worker()
    steps = core._report(held, "complete", {"ok": True})
    first = next(steps)
    assert isinstance(steps.throw(psycopg.errors.LockNotAvailable("55P03")), Sleep)
    assert next(steps) == first and owner.confirmed          # no connection was lost
    with pytest.raises(StopIteration) as done:
        steps.send([("accepted",)])
    assert done.value.value == "accepted"


class ResultsGoWithTheirClaim(Worker):
    """Broken on purpose: results whose claim's answer was lost are not sent again (the
    claim's rule applied to both)."""

    def _send_results(self) -> Steps[None]:
        self._pending = []
        yield from ()


def results_in_hand(core: Worker, held: Held) -> Steps[list[Held] | None]:
    core.owner._valid_until, core.owner._stopping = float("inf"), False
    core._pending = [(held, 0.0, {"ok": True})]
    return core._claim()


def test_a_batchs_results_ride_with_the_next_claim() -> None:
    """One transaction, one round trip: the results' statement, then the claim."""
    _, core, held = worker()
    steps = results_in_hand(core, held)
    together = next(steps)
    assert isinstance(together, Together)
    assert [c.step for c in together.calls] == ["complete", "claim"]
    assert together.calls[0].params[0] == held.task.attempt_id
    with pytest.raises(StopIteration) as done:
        steps.send([[("accepted",)], [(2, uuid.uuid4(), 1, {})]])
    assert [h.task.task_id for h in done.value.value] == [2]
    assert core.verdicts["accepted"] == 1 and not core._pending


def sent(op: Any) -> Any:
    """What a statement sends (a Jsonb parameter compared by its value), or op itself."""
    if not isinstance(op, Call):
        return op
    return (op.step, op.query, tuple(getattr(p, "obj", p) for p in op.params))


def lost_together(core: Worker, held: Held) -> tuple[Together, list[Any]]:
    """The results and the claim sent together, their answer lost; what the worker sends
    after (answered duplicate), and what its claim returns."""
    steps = results_in_hand(core, held)
    together = next(steps)
    assert isinstance(together, Together)
    after: list[Any] = []
    try:
        op = steps.throw(error(None))
        while True:
            after.append(op)
            op = steps.send([("duplicate",)] if isinstance(op, Call) else None)
    except StopIteration as done:
        after.append(done.value)
    return together, after


def test_a_lost_answer_sends_the_results_again_alone_and_not_the_claim() -> None:
    owner, core, held = worker()
    together, after = lost_together(core, held)
    # The results' statement again, alone, with the same attempt id (reconnected; its own
    # retries back off); no claim: None.
    assert [sent(op) for op in after] == [sent(together.calls[0]), None]
    assert core.verdicts["duplicate"] == 1 and not owner.confirmed


def test_negative_control_results_lost_with_their_claim() -> None:
    owner, core, held = worker()
    core = ResultsGoWithTheirClaim(owner, "q", lambda p, ctx: p)
    together, after = lost_together(core, held)
    assert sent(together.calls[0]) not in map(sent, after)
    assert sum(core.verdicts.values()) == 0


def test_a_rolled_back_batch_and_claim_go_again_one_by_one() -> None:
    """A refusal or a rollback undid both: the results go alone, then the claim alone."""
    owner, core, held = worker()
    steps = results_in_hand(core, held)
    together = next(steps)
    assert isinstance(together, Together)
    assert sent(steps.throw(psycopg.errors.DeadlockDetected("40P01"))) == \
        sent(together.calls[0])
    assert steps.send([("accepted",)]) == together.calls[1]
    with pytest.raises(StopIteration) as done:
        steps.send([(2, uuid.uuid4(), 1, {})])
    assert len(done.value.value) == 1 and core.verdicts["accepted"] == 1 and owner.confirmed


class NeverWoken(Owner):
    """Broken on purpose: a handler's deadline never wakes the renewer (it sleeps past it)."""

    def renew_until(self, deadline: float | None, why: str = "a progress deadline") -> None:
        self._progress = None if deadline is None else (deadline, why)


def woken_by(owner: Owner) -> list[str]:
    """Which deadlines wake a renewer asleep until its next renewal, 10 s away: set after it,
    lifted, set before it."""
    owner.lease_id, owner.generation, owner._stopping = uuid.uuid4(), 1, False
    steps = owner._renew_loop()
    assert isinstance(next(steps), Sleep)
    woken = []
    for name, deadline in (("after", 20.0), ("lifted", None), ("before", 5.0)):
        owner.renew_until(deadline)
        if owner._wake.is_set():
            woken.append(name)
            owner._wake.clear()
    return woken


def test_the_renewer_is_woken_only_for_a_deadline_it_would_sleep_past() -> None:
    assert woken_by(Owner("", "r", ttl=30, renew_every=10, clock=lambda: 0.0)) == ["before"]


def test_negative_control_a_renewer_that_sleeps_past_a_deadline() -> None:
    assert woken_by(NeverWoken("", "r", ttl=30, renew_every=10, clock=lambda: 0.0)) == []

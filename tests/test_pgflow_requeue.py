"""Stalled-task recovery never takes over a task whose attempt can still be accepted (issue 40,
item 1), property-based, on pgflow 0.8.1 and 0.14.1 (the fixture pgflow_version).

pgflow 0.14.1's own requeue_stalled_tasks, which the layer's job ran, takes back a task started
more than its *flow's* timeout + 30 s ago and shows its message at once, whatever its step's
timeout: a flow of 1 s with a step of 120 s has its live task run twice after 32 s. The layer's
rule, which its recovery job and the takeover of a read share (pgfence_pgflow.stalled), with T
the step's timeout, else the flow's, as the start uses:

    a started task has stalled when its message is visible again past T + 2 s since its start
    (the visibility the start gives it), or when its attempt's lease has ended (not live) and
    T has passed since its start.

The property, over the flow's timeout, the step's, the handler's time since the start, the
lease's state and how far the message's visibility was extended past the start's: after the
layer's recovery job and a read by another worker function on the same flow, a task that has
not stalled is still its attempt's (nothing took it over, its result is accepted) and its message
is still hidden as it was, and a task that has stalled is taken over by that read (its attempt's
result is stale). Each example runs in one transaction, so its clock (now()) stands still: the
verdict depends on no machine's speed. The negative control runs pgflow's own rule
(pgflow.requeue_stalled_tasks, 0.14.1) and finds a live task taken over.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, find, given, settings
from hypothesis import strategies as st

from testkit.harness import Database, Session
from tests.test_pgflow import complete

LEASES = ("current", "draining", "expired", "released", "superseded")
LIVE = ("current", "draining")


@dataclass(frozen=True)
class Case:
    flow_timeout: int         # pgflow.flows.opt_timeout, s
    step_timeout: int | None  # pgflow.steps.opt_timeout, s (NULL: the flow's)
    handler: int              # s since the task's start
    lease: str                # the state of the lease the task was started under
    extended: int             # s the message's visibility was extended past what the start gave

    @property
    def timeout(self) -> int:
        return self.step_timeout if self.step_timeout is not None else self.flow_timeout

    @property
    def visible(self) -> bool:
        return self.handler >= self.timeout + 2 + self.extended

    @property
    def stalled(self) -> bool:
        """The layer's rule (the test's oracle)."""
        return ((self.visible and self.handler >= self.timeout + 2)
                or (self.lease not in LIVE and self.handler >= self.timeout))


cases = st.builds(Case, flow_timeout=st.integers(1, 90),
                  step_timeout=st.one_of(st.none(), st.integers(1, 300)),
                  handler=st.integers(0, 400), lease=st.sampled_from(LEASES),
                  extended=st.sampled_from([0, 0, 1, 30, 3600]))

# The issue's own: a flow of 1 s, a step of 120 s, the handler 32 s in, its lease current.
ISSUE = Case(flow_timeout=1, step_timeout=120, handler=32, lease="current", extended=0)


@dataclass
class Outcome:
    visible_after_recovery: bool
    taken_over: bool
    result: str


@pytest.fixture
def flow_one(flow: Database) -> Iterator[tuple[Database, Session]]:
    """Flow `one`, one step `only`, served by two worker functions (fn1, fn2); a session that
    runs each example in a transaction it rolls back."""
    flow.sql("select pgflow.create_flow('one', max_attempts => 3)")
    flow.sql("select pgflow.add_step('one', 'only')")
    for r in ("fn1", "fn2"):
        flow.sql("select pgfence.register(%s)", (r,))
    s = flow.session("example")
    yield flow, s


def run_case(s: Session, c: Case, recovery: str) -> Outcome:
    s.begin()
    try:
        s.run("update pgflow.flows set opt_timeout = %s where flow_slug = 'one'", (c.flow_timeout,))
        s.run("update pgflow.steps set opt_timeout = %s where flow_slug = 'one'", (c.step_timeout,))
        s.run("select pgflow.start_flow('one', '{}')")
        a = s.one("select lease_id from pgfence.acquire('fn1', 'a', '1 hour')")
        b = s.one("select lease_id from pgfence.acquire('fn2', 'b', '1 hour')")
        [(attempt,)] = s.run("select attempt_id from pgfence_pgflow.start_tasks(%s, 'one', 'one', "
                             "'30 seconds', 1)", (a,))
        # Time passes for the task (its start, queued before it) and for its message, as the
        # start left it, extended by `extended` s; the transaction's clock stands still.
        s.run("update pgflow.step_tasks set started_at = now() - make_interval(secs => %s), "
              "queued_at = now() - make_interval(secs => %s + 1)", (c.handler, c.handler))
        s.run("update pgmq.q_one set vt = now() - make_interval(secs => %s) "
              "+ make_interval(secs => %s)", (c.handler, c.timeout + 2 + c.extended))
        if c.lease == "draining":
            s.run("select pgfence.drain(%s)", (a,))
        elif c.lease == "expired":
            s.run("select pgfence_test.expire(%s)", (a,))
        elif c.lease == "released":
            s.run("select pgfence.release(%s)", (a,))
        elif c.lease == "superseded":
            s.run("select pgfence_test.expire(%s)", (a,))
            s.run("select pgfence.acquire('fn1', 'successor', '1 hour')")
        s.run(recovery)
        visible = bool(s.one("select vt <= now() from pgmq.q_one"))
        taken = s.run("select attempt_id from pgfence_pgflow.start_tasks(%s, 'one', 'one', "
                      "'30 seconds', 1)", (b,))
        return Outcome(visible, bool(taken), complete(s, attempt, '{"by": "a"}'))
    finally:
        s.rollback()


LAYERS_RECOVERY = "select pgfence_pgflow.requeue_stalled_tasks()"
PGFLOWS_RECOVERY = "select pgflow.requeue_stalled_tasks()"


def violations(s: Session, c: Case, recovery: str = LAYERS_RECOVERY) -> list[str]:
    got = run_case(s, c, recovery)
    out = []
    if not c.stalled:
        if got.taken_over or got.result != "accepted":
            out.append(f"{c}: a task whose attempt could still be accepted was taken over ({got})")
        if got.visible_after_recovery != c.visible:
            out.append(f"{c}: recovery changed the visibility of a live task's message ({got})")
    elif not got.taken_over or got.result != "stale":
        out.append(f"{c}: a stalled task was not taken over ({got})")
    return out


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(ISSUE)
@example(Case(flow_timeout=60, step_timeout=None, handler=62, lease="current", extended=0))
@example(Case(flow_timeout=60, step_timeout=None, handler=61, lease="current", extended=0))
@example(Case(flow_timeout=60, step_timeout=10, handler=10, lease="expired", extended=3600))
@example(Case(flow_timeout=60, step_timeout=10, handler=9, lease="released", extended=3600))
@example(Case(flow_timeout=5, step_timeout=100, handler=101, lease="draining", extended=3600))
@given(cases)
def test_recovery_takes_over_exactly_the_stalled_tasks(
        flow_one: tuple[Database, Session], c: Case) -> None:
    _, s = flow_one
    assert violations(s, c) == []


def test_negative_control_pgflows_own_rule_runs_a_live_task_twice(
        flow_one: tuple[Database, Session], pgflow_version: str) -> None:
    if pgflow_version != "0.14.1":
        pytest.skip("pgflow 0.8.1 has no requeue_stalled_tasks of its own (0.13 and later)")
    _, s = flow_one
    assert violations(s, ISSUE, PGFLOWS_RECOVERY), "pgflow's rule took the issue's task over"
    # And hypothesis finds such a case by itself.
    found = find(cases, lambda c: not c.stalled and bool(violations(s, c, PGFLOWS_RECOVERY)),
                 settings=settings(max_examples=300, database=None, deadline=None))
    # (A task whose handler is within its step's timeout, or whose worker extended its message,
    # taken back by the flow's timeout + 30 s.)
    assert found.handler > found.flow_timeout + 30, found

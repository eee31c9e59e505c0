"""The pgflow layer against the real pgflow (npm @pgflow/core 0.8.1, its migrations applied by
testkit.install, and 0.14.1, tests/pgflow14.py: every test on both, the fixture
pgflow_version of tests/conftest.py) on the real pgmq, directly and through PgBouncer in transaction
mode: pgflow's worker protocol under a lease, each scenario with a negative control that breaks
the mechanism it rests on (or uses pgflow's own, unfenced protocol) and sees the scenario fail.

The flow is pgflow's own: `two`, steps `first` then `second` (second depends on first), made
with pgflow.create_flow / add_step and run with pgflow.start_flow. Time passing is simulated
(pgfence_test.expire for a lease, stall_task for a started task's time); blocking is
observed with pg_blocking_pids(), never waited out.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from testkit.harness import Database, Lease, Session, Step, sqlstate
from tests.support import acquired

START = "pgfence_pgflow.start_tasks(uuid,text,text,interval,integer)"


def two_steps(db: Database, resources: tuple[str, ...] = ("fn",),
              timeout: int | None = None) -> uuid.UUID:
    """Flow `two` (first -> second), its workers' resources, and one run of it started. A
    started task's message stays hidden for the steps' ``timeout`` + 2 s (pgflow's default
    timeout: 60 s)."""
    if timeout is None:
        db.sql("select pgflow.create_flow('two', max_attempts => 3)")
    else:
        db.sql("select pgflow.create_flow('two', max_attempts => 3, timeout => %s)", (timeout,))
    db.sql("select pgflow.add_step('two', 'first')")
    db.sql("select pgflow.add_step('two', 'second', array['first'])")
    for r in resources:
        db.sql("select pgfence.register(%s)", (r,))
    return uuid.UUID(str(db.one("select run_id from pgflow.start_flow('two', '{\"n\": 1}')")))


def protect(db: Database, mode: str, resources: tuple[str, ...] = ("fn",)) -> None:
    """What an operator protects for a pgflow deployment: step_tasks and the flow's queue."""
    for tbl in ("pgflow.step_tasks", "pgmq.q_two"):
        db.sql("select pgfence.protect(%s, %s::text[], %s, consumers_only => true)",
               (tbl, list(resources), mode))


def start(s: Session, lease: Lease, qty: int = 5) -> list[tuple[Any, ...]]:
    """(attempt_id, step_slug, input) of each task started."""
    return [(a, step, inp) for a, step, inp in s.run(
        "select attempt_id, step_slug, input from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
        "'30 seconds', %s)", (lease.lease_id, qty))]


def complete(s: Session, attempt_id: uuid.UUID, output: str) -> str:
    return str(s.one("select pgfence_pgflow.complete_task(%s, %s::jsonb)", (attempt_id, output)))


def fail(s: Session, attempt_id: uuid.UUID, error: str = "boom") -> str:
    return str(s.one("select pgfence_pgflow.fail_task(%s, %s)", (attempt_id, error)))


def task(db: Database, step: str) -> tuple[str, int, Any]:
    """(status, attempts_count, output) of a step's task."""
    rows = db.sql("select status, attempts_count, output from pgflow.step_tasks "
                  "where step_slug = %s", (step,))
    assert len(rows) == 1, rows
    return rows[0][0], rows[0][1], rows[0][2]


def msg_of(db: Database, step: str) -> int:
    return int(db.one("select message_id from pgflow.step_tasks where step_slug = %s", (step,)))


def paused_past_everything(db: Database, a: Lease, step: str) -> None:
    """A is paused past its lease and past its task's step's timeout + 2 s (its start moved
    back, its message visible again)."""
    db.expire(a)
    db.sql("select pgfence_test.stall_task('two', %s)", (msg_of(db, step),))


def run_status(db: Database, run_id: uuid.UUID) -> tuple[str, Any]:
    status, output = db.sql("select status, output from pgflow.runs where run_id = %s",
                            (run_id,))[0]
    return str(status), output


# -- a paused worker wakes up after its successor took over -----------------------------------

def test_a_stale_worker_starts_nothing(any_flow: Database) -> None:
    two_steps(any_flow)
    a, b = any_flow.session("a"), any_flow.session("b")
    la = acquired(a.acquire("fn"))
    any_flow.expire(la)
    lb = acquired(b.acquire("fn"))
    assert sqlstate(lambda: start(a, la)) == "PF001"
    assert task(any_flow, "first") == ("queued", 0, None)
    assert [step for _, step, _ in start(b, lb)] == ["first"]


def test_negative_control_a_start_without_the_fenced_read(flow: Database) -> None:
    flow.install_mutant("pgflow-start-unfenced-read")
    two_steps(flow)
    a, b = flow.session("a"), flow.session("b")
    la = acquired(a.acquire("fn"))
    flow.expire(la)
    acquired(b.acquire("fn"))
    assert [step for _, step, _ in start(a, la)] == ["first"], "the stale worker started a task"


def test_a_task_taken_over_keeps_only_the_new_attempts_result(any_flow: Database) -> None:
    run_id = two_steps(any_flow)
    a, b = any_flow.session("a"), any_flow.session("b")
    la = acquired(a.acquire("fn"))
    [(stale, _, _)] = start(a, la)
    paused_past_everything(any_flow, la, "first")
    lb = acquired(b.acquire("fn"))
    [(fresh, step, inp)] = start(b, lb)
    assert (step, inp) == ("first", {"run": {"n": 1}})
    assert task(any_flow, "first") == ("started", 2, None), "B started it again"

    assert complete(a, stale, '{"by": "a"}') == "stale"
    assert complete(a, stale, '{"by": "a"}') == "stale"  # a retry adds no second record
    assert fail(a, stale) == "stale"
    assert any_flow.sql("select kind, body from pgfence_pgflow.stale_results "
                        "where attempt_id = %s order by kind", (stale,)) == [
        ("complete", {"by": "a"}), ("fail", {"error_message": "boom"})]
    assert task(any_flow, "first") == ("started", 2, None), "A's result never reached pgflow"

    assert complete(b, fresh, '{"by": "b"}') == "accepted"
    [(second, step, inp)] = start(b, lb)
    assert (step, inp) == ("second", {"run": {"n": 1}, "first": {"by": "b"}})
    assert complete(b, second, '{"done": true}') == "accepted"
    assert task(any_flow, "first") == ("completed", 2, {"by": "b"})
    assert run_status(any_flow, run_id) == ("completed", {"second": {"done": True}})
    assert any_flow.one("select count(*) from realtime.stand_in_calls "
                        "where event = 'run:completed'") == 1, "the run completed exactly once"
    # The pgmq layer's record of the reads: A's read never finished, B's were archived by pgflow.
    assert any_flow.sql("select msg_id, read_ct, outcome from pgfence_pgmq.attempts "
                        "order by msg_id, read_ct") == [(1, 1, None), (1, 2, "archive"),
                                                        (2, 1, "archive")]


def test_negative_control_without_the_takeover_the_task_is_stuck(flow: Database) -> None:
    flow.install_mutant("pgflow-no-takeover")
    two_steps(flow)
    a, b = flow.session("a"), flow.session("b")
    la = acquired(a.acquire("fn"))
    start(a, la)
    paused_past_everything(flow, la, "first")
    lb = acquired(b.acquire("fn"))
    assert start(b, lb) == [], "pgflow's start_tasks starts only queued tasks"
    assert task(flow, "first") == ("started", 1, None)


def test_negative_control_judged_without_attempts_count_the_stale_result_lands(
        flow: Database) -> None:
    flow.install_mutant("pgflow-finish-ignores-attempts-count")
    two_steps(flow)
    a, b = flow.session("a"), flow.session("b")
    la = acquired(a.acquire("fn"))
    [(stale, _, _)] = start(a, la)
    paused_past_everything(flow, la, "first")
    start(b, acquired(b.acquire("fn")))
    assert complete(a, stale, '{"by": "a"}') == "accepted"
    assert task(flow, "first") == ("completed", 2, {"by": "a"}), "A's output over B's start"


def test_negative_control_pgflows_unfenced_protocol_lets_the_stale_completion_land(
        flow: Database) -> None:
    """The seed's bug: worker A polls with pgflow's own protocol (pgmq.read_with_poll,
    pgflow.start_tasks, pgflow.complete_task); B, fenced, takes the task over; A's late
    completion lands on the task B started again, and B's is thrown away."""
    two_steps(flow)
    a, b = flow.session("a"), flow.session("b")
    worker = uuid.uuid4()
    a.run("insert into pgflow.workers (worker_id, queue_name, function_name) "
          "values (%s, 'two', 'fn')", (worker,))
    [(msg,)] = a.run("select msg_id from pgmq.read_with_poll('two', 30, 1, 1, 100)")
    [(step,)] = a.run("select step_slug from pgflow.start_tasks('two', array[%s::bigint], %s)",
                      (msg, worker))
    assert step == "first"
    flow.sql("select pgfence_test.stall_task('two', %s)", (msg,))
    [(fresh, _, _)] = start(b, acquired(b.acquire("fn")))
    a.run("select pgflow.complete_task(run_id, step_slug, task_index, '{\"by\": \"a\"}') "
          "from pgflow.step_tasks where step_slug = 'first'")
    assert task(flow, "first") == ("completed", 2, {"by": "a"}), "A's stale output landed"
    assert complete(b, fresh, '{"by": "b"}') == "stale", "and B's valid one is refused"


@pytest.mark.parametrize("mode", ["unprotected", "enforce"])
def test_a_late_result_nobody_overtook_is_kept(any_flow: Database, mode: str) -> None:
    run_id = two_steps(any_flow)
    if mode == "enforce":
        protect(any_flow, "enforce")
    a, b = any_flow.session("a"), any_flow.session("b")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    any_flow.expire(la)
    lb = acquired(b.acquire("fn"))
    assert start(b, lb) == [], "the task is still A's (its message's visibility has not run out)"
    assert complete(a, attempt, '{"late": true}') == "accepted"
    assert complete(a, attempt, '{"late": true}') == "duplicate"
    assert fail(a, attempt) == "duplicate"
    assert task(any_flow, "first") == ("completed", 1, {"late": True})
    [(second, step, _)] = start(b, lb)
    assert step == "second"
    assert complete(b, second, "{}") == "accepted"
    assert run_status(any_flow, run_id)[0] == "completed"
    assert any_flow.one("select count(*) from pgfence_pgflow.stale_results") == 0
    # The late result admitted pgflow's writes for that call only: the stale worker's
    # transaction is not left fenced by it.
    a.begin()
    complete(a, attempt, "{}")
    assert a.one("select coalesce(current_setting('pgfence.fenced', true), '')") == ""
    a.rollback()


def test_negative_control_a_late_result_judged_by_its_lease(flow: Database) -> None:
    flow.install_mutant("pgflow-finish-needs-live-lease")
    two_steps(flow)
    a, b = flow.session("a"), flow.session("b")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    flow.expire(la)
    acquired(b.acquire("fn"))
    assert sqlstate(lambda: complete(a, attempt, "{}")) == "PF001", "a valid result thrown away"


def test_negative_control_a_late_result_without_its_marker_is_refused(flow: Database) -> None:
    flow.install_mutant("pgflow-finish-unmarked")
    two_steps(flow)
    protect(flow, "enforce")
    a = flow.session("a")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    flow.expire(la)
    assert sqlstate(lambda: complete(a, attempt, "{}")) == "PF007"


# -- failures, retries and deaths ---------------------------------------------------------------

def test_fail_task_retries_then_fails_for_good_by_pgflows_rules(any_flow: Database) -> None:
    run_id = two_steps(any_flow)
    any_flow.sql("update pgflow.flows set opt_max_attempts = 2, opt_base_delay = 0")
    w = any_flow.session("w")
    lease = acquired(w.acquire("fn"))
    [(first, _, _)] = start(w, lease)
    assert fail(w, first, "try again") == "accepted"
    assert task(any_flow, "first")[:2] == ("queued", 1), "pgflow queued it for a retry"
    assert any_flow.one("select outcome from pgfence_pgmq.attempts") is None, "message kept"
    [(again, _, _)] = start(w, lease)
    assert fail(w, again, "for good") == "accepted"
    assert task(any_flow, "first")[:2] == ("failed", 2)
    assert run_status(any_flow, run_id)[0] == "failed"
    assert any_flow.sql("select read_ct, outcome from pgfence_pgmq.attempts order by read_ct") \
        == [(1, None), (2, "archive")]
    # The core's verdict: a superseded attempt is stale, also once the task has finished and
    # although its own first result was accepted; each different report kept, a retry of one
    # adds nothing (issue 24: this was "duplicate", and a second report was dropped).
    assert fail(w, first, "late") == "stale"
    assert fail(w, first, "late") == "stale"
    assert fail(w, first, "later") == "stale"
    assert complete(w, first, '{"late": true}') == "stale"
    assert any_flow.sql("select report, kind, body from pgfence_pgflow.stale_results order by "
                        "report") == [
        (1, "fail", {"error_message": "late"}), (2, "fail", {"error_message": "later"}),
        (3, "complete", {"late": True})]
    assert fail(w, again, "for good") == "duplicate", "its finisher's retry: a duplicate"


def test_a_hard_killed_workers_task_comes_back(flow: Database) -> None:
    two_steps(flow)
    a = flow.session("a")
    la = acquired(a.acquire("fn"))
    a.begin()
    start(a, la)
    pid = a.pid
    flow.sql("select pg_terminate_backend(%s)", (pid,))
    # It returns before the backend is gone; B's start skips the message still locked by it.
    flow.wait_until("select not exists (select from pg_stat_activity where pid = %s)", (pid,))
    assert task(flow, "first") == ("queued", 0, None), "the start never committed"
    # A worker that dies after its start committed: the task comes back with its message.
    b = flow.session("b")
    flow.expire(la)
    lb = acquired(b.acquire("fn"))
    [(lost, _, _)] = start(b, lb)
    b.close()
    paused_past_everything(flow, lb, "first")
    c = flow.session("c")
    lc = acquired(c.acquire("fn"))
    [(attempt, step, _)] = start(c, lc)
    assert step == "first" and complete(c, attempt, "{}") == "accepted"
    assert flow.one("select pgfence_pgflow.complete_task(%s, '{}')", (lost,)) == "stale"


# -- interleavings: a takeover racing a late result --------------------------------------------

def test_a_late_result_waits_for_a_takeover_in_flight_and_is_stale(any_flow: Database) -> None:
    two_steps(any_flow)
    a, b = any_flow.session("a"), any_flow.session("b")
    la = acquired(a.acquire("fn"))
    [(stale, _, _)] = start(a, la)
    paused_past_everything(any_flow, la, "first")
    lb = acquired(b.acquire("fn"))
    b.begin()
    [(fresh, _, _)] = start(b, lb)
    step = a.start("select pgfence_pgflow.complete_task(%s, '{\"by\": \"a\"}')", (stale,))
    assert step.settle() is True and step.blocked_by == [b.pid]
    b.commit()
    assert step.one() == "stale"
    assert complete(b, fresh, '{"by": "b"}') == "accepted"
    assert task(any_flow, "first") == ("completed", 2, {"by": "b"})


# A session that holds the step's state row, which pgflow's complete_task locks after the run:
# a late completion is held inside pgflow.complete_task, past the layer's own locks.
HOLD_STEP = ("select from pgflow.step_states where run_id = %s and step_slug = 'first' "
             "for update")


def test_a_late_result_and_a_takeover_never_deadlock(flow: Database) -> None:
    """A's late completion is held inside pgflow.complete_task (another session holds the step
    state row it locks); meanwhile B polls the message A's task came from. B skips it, and A's
    result is kept: the message is locked before the task, in the order of B's read and
    takeover."""
    run_id = two_steps(flow)
    a, b, c = flow.session("a"), flow.session("b"), flow.session("c")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    paused_past_everything(flow, la, "first")
    c.begin()
    c.run(HOLD_STEP, (run_id,))
    late = a.start("select pgfence_pgflow.complete_task(%s, '{\"late\": true}')", (attempt,))
    assert late.settle() is True and late.blocked_by == [c.pid]
    lb = acquired(b.acquire("fn"))
    poll = b.start("select count(*) from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                   "'30 seconds', 5)", (lb.lease_id,))
    assert poll.settle() is False and poll.one() == 0, "B skipped the message A holds"
    c.commit()
    assert late.one() == "accepted"
    assert task(flow, "first") == ("completed", 1, {"late": True})


def test_negative_control_task_before_message_deadlocks(flow: Database) -> None:
    flow.install_mutant("pgflow-finish-message-unlocked")
    run_id = two_steps(flow)
    a, b, c = flow.session("a"), flow.session("b"), flow.session("c")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    paused_past_everything(flow, la, "first")
    c.begin()
    c.run(HOLD_STEP, (run_id,))
    late = a.start("select pgfence_pgflow.complete_task(%s, '{\"late\": true}')", (attempt,))
    assert late.settle() is True
    lb = acquired(b.acquire("fn"))
    poll = b.start("select count(*) from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                   "'30 seconds', 5)", (lb.lease_id,))
    assert poll.settle() is True and poll.blocked_by == [a.pid], "B read it, waits for A's task"
    c.commit()
    outcomes = [sqlstate(late.result), sqlstate(poll.result)]
    assert "40P01" in outcomes, f"no deadlock: {outcomes}"


# The task row itself, held by a third session (issue 43 item 8 a): the late result has the run
# and the message when it reaches the task, so a takeover's read skips the message.
HOLD_TASK = ("select from pgflow.step_tasks where run_id = %s and step_slug = 'first' "
             "for update")


def late_result_behind_a_held_task(flow: Database) -> tuple[Step, Step, Session]:
    """C holds A's task row; A's late completion waits for it; B, which took over, polls the
    flow's queue. The completion's step and the poll's step, and C."""
    run_id = two_steps(flow)
    a, b, c = flow.session("a"), flow.session("b"), flow.session("c")
    la = acquired(a.acquire("fn"))
    [(attempt, _, _)] = start(a, la)
    paused_past_everything(flow, la, "first")
    c.begin()
    c.run(HOLD_TASK, (run_id,))
    late = a.start("select pgfence_pgflow.complete_task(%s, '{\"late\": true}')", (attempt,))
    assert late.settle() is True and late.blocked_by == [c.pid]
    lb = acquired(b.acquire("fn"))
    poll = b.start("select count(*) from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                   "'30 seconds', 5)", (lb.lease_id,))
    return late, poll, c


def test_a_late_result_and_a_takeover_never_deadlock_behind_a_held_task(flow: Database) -> None:
    """The order of finish is the run, then the message, then the task: A holds the message
    while it waits for the task, B's read skips it, and A's result is kept."""
    late, poll, c = late_result_behind_a_held_task(flow)
    assert poll.settle() is False and poll.one() == 0, "B skipped the message A holds"
    c.commit()
    assert late.one() == "accepted"
    assert task(flow, "first") == ("completed", 1, {"late": True})


def test_negative_control_the_task_locked_before_the_message_deadlocks(flow: Database) -> None:
    """finish with the message's lock moved after the task's: B reads the message A has not
    locked yet and waits for the task; once C lets go, A takes the task and waits for the
    message: one of the two is a deadlock victim (40P01)."""
    flow.install_mutant("pgflow-finish-task-before-message")
    late, poll, c = late_result_behind_a_held_task(flow)
    assert poll.settle() is True, "B read the message and waits for the task"
    c.commit()
    outcomes = [sqlstate(late.result), sqlstate(poll.result)]
    assert "40P01" in outcomes, f"no deadlock: {outcomes}"


# -- a batch's results (complete_many): two batches never deadlock ----------------------------

def pairs(db: Database) -> tuple[list[uuid.UUID], dict[tuple[int, str], uuid.UUID]]:
    """Flow `pair` (two root steps, s1 and s2), two runs of it, its four tasks started by one
    worker: the runs, and each task's attempt by (run 1 or 2, step)."""
    db.sql("select pgflow.create_flow('pair')")
    db.sql("select pgflow.add_step('pair', 's1')")
    db.sql("select pgflow.add_step('pair', 's2')")
    db.sql("select pgfence.register('fn')")
    runs = [uuid.UUID(str(db.one("select run_id from pgflow.start_flow('pair', %s::jsonb)",
                                 (f'{{"n": {n}}}',)))) for n in (1, 2)]
    w = db.session("w")
    lease = acquired(w.acquire("fn"))
    rows = w.run("select attempt_id, run_id, step_slug from pgfence_pgflow.start_tasks(%s, "
                 "'pair', 'pair', '1 hour', 4)", (lease.lease_id,))
    return runs, {(runs.index(run) + 1, step): attempt for attempt, run, step in rows}


def batches_behind(db: Database, held: str, row: uuid.UUID, first: list[uuid.UUID],
                   second: list[uuid.UUID]) -> tuple[Step, Step]:
    """C holds one row (``held``, SQL, of ``row``): the first that batch ``first`` names. A
    sends ``first`` and waits for C; B sends ``second``, which names the same rows in another
    order, and waits too: behind C, or behind A, which waits for C holding its place in the
    row's queue (pg_blocking_pids). Then C lets go: A's and B's steps. Locked in the order
    given, A waits for the row B took meanwhile, and B for A's: a deadlock."""
    a, b, c = db.session("a"), db.session("b"), db.session("c")
    c.begin()
    c.run(held, (row,))
    steps = []
    for s, batch in ((a, first), (b, second)):
        step = s.start("select array_agg(outcome order by n) from pgfence_pgflow.complete_many("
                       "%s::uuid[]) with ordinality m(attempt_id, outcome, n)", (batch,))
        assert step.settle() is True and step.blocked_by \
            and set(step.blocked_by) <= {c.pid, a.pid}
        steps.append(step)
    c.commit()
    return steps[0], steps[1]


ATTEMPT_HELD = "select from pgfence_pgflow.attempts where attempt_id = %s for update"
RUN_HELD = "select from pgflow.runs where run_id = %s for update"


def test_a_batch_and_its_copy_in_another_order_never_deadlock(flow: Database) -> None:
    """A batch and its resend in the other order (a lost answer sent again while the first copy
    still runs): the attempts are locked in one order, so the second waits for the first and is
    told duplicate for each."""
    _, attempt = pairs(flow)
    x, y = attempt[1, "s1"], attempt[2, "s1"]
    a, b = batches_behind(flow, ATTEMPT_HELD, x, [x, y], [y, x])
    assert a.one() == ["accepted", "accepted"]
    assert b.one() == ["duplicate", "duplicate"]


def test_negative_control_attempts_locked_in_the_given_order_deadlock(flow: Database) -> None:
    flow.install_mutant("pgflow-batch-attempts-unsorted")
    _, attempt = pairs(flow)
    x, y = attempt[1, "s1"], attempt[2, "s1"]
    a, b = batches_behind(flow, ATTEMPT_HELD, x, [x, y], [y, x])
    outcomes = [sqlstate(a.result), sqlstate(b.result)]
    assert "40P01" in outcomes, f"no deadlock: {outcomes}"


def test_two_batches_over_the_same_runs_never_deadlock(flow: Database) -> None:
    """Two batches of different attempts of the same two runs, the runs in opposite orders:
    the runs are locked in one order across each batch, so one waits for the other and both
    are accepted."""
    runs, attempt = pairs(flow)
    a, b = batches_behind(flow, RUN_HELD, runs[0], [attempt[1, "s1"], attempt[2, "s1"]],
                          [attempt[2, "s2"], attempt[1, "s2"]])
    assert [a.one(), b.one()] == [["accepted", "accepted"]] * 2
    assert flow.one("select count(*) from pgflow.runs where status = 'completed'") == 2


def test_negative_control_runs_locked_in_the_given_order_deadlock(flow: Database) -> None:
    flow.install_mutant("pgflow-batch-runs-unsorted")
    runs, attempt = pairs(flow)
    a, b = batches_behind(flow, RUN_HELD, runs[0], [attempt[1, "s1"], attempt[2, "s1"]],
                          [attempt[2, "s2"], attempt[1, "s2"]])
    outcomes = [sqlstate(a.result), sqlstate(b.result)]
    assert "40P01" in outcomes, f"no deadlock: {outcomes}"


# -- old binaries calling pgflow directly, producers, the update window ------------------------

def test_an_unconverted_worker_is_seen_then_refused(any_flow: Database) -> None:
    two_steps(any_flow)
    protect(any_flow, "observe")
    old = any_flow.session("old")
    worker = uuid.uuid4()
    old.run("insert into pgflow.workers (worker_id, queue_name, function_name) "
            "values (%s, 'two', 'fn')", (worker,))
    [(msg,)] = old.run("select msg_id from pgmq.read_with_poll('two', 30, 1, 1, 100)")
    old.run("select * from pgflow.start_tasks('two', array[%s::bigint], %s)", (msg, worker))
    old.run("select pgflow.complete_task(run_id, step_slug, task_index, '{}') "
            "from pgflow.step_tasks where step_slug = 'first'")
    seen = any_flow.sql("select distinct table_name, operation from pgfence.unfenced_writes "
                        "order by 1, 2")
    assert seen == [("pgflow.step_tasks", "UPDATE"), ("pgmq.q_two", "DELETE"),
                    ("pgmq.q_two", "UPDATE")]
    protect(any_flow, "enforce")
    assert sqlstate(lambda: old.run(
        "select * from pgmq.read_with_poll('two', 30, 1, 1, 100)")) == "PF007"
    assert sqlstate(lambda: old.run(
        "select * from pgflow.start_tasks('two', array[2::bigint], %s)", (worker,))) == "PF007"
    assert sqlstate(lambda: old.run(
        "select pgflow.fail_task(run_id, step_slug, task_index, 'x') "
        "from pgflow.step_tasks where step_slug = 'second'")) == "PF007"
    # Producers need no lease; converted workers run the flow as before.
    assert old.one("select count(*) from pgflow.start_flow('two', '{}')") == 1
    w = any_flow.session("w")
    lease = acquired(w.acquire("fn"))
    started = start(w, lease)
    assert sorted(step for _, step, _ in started) == ["first", "second"]
    assert all(complete(w, attempt, "{}") == "accepted" for attempt, _, _ in started)
    assert any_flow.one("select bool_and(healthy) from pgfence.protected_tables") is True


def test_negative_control_step_tasks_guarded_against_producers(flow: Database) -> None:
    flow.install_mutant("protect-consumers-only-ignored")
    two_steps(flow)
    protect(flow, "enforce")
    assert sqlstate(lambda: flow.session("producer").run(
        "select * from pgflow.start_flow('two', '{}')")) == "PF007"


def test_the_update_window_drains_and_restores_exactly(any_flow: Database) -> None:
    two_steps(any_flow)
    protect(any_flow, "enforce")
    w = any_flow.session("w")
    lease = acquired(w.acquire("fn"))
    [(attempt, _, _)] = start(w, lease)
    op = any_flow.session("op")
    token = op.one("select pgfence.prepare_update(array['fn'], %s)", (uuid.uuid4(),))
    assert sqlstate(lambda: start(w, lease)) == "PF001", "a draining worker starts nothing"
    assert any_flow.one("select verdict from pgfence.update_status(%s)", (token,)) == "draining"
    assert complete(w, attempt, "{}") == "accepted", "it finishes the task in hand"
    w.release(lease)
    assert any_flow.one("select verdict from pgfence.update_status(%s)", (token,)) == "drained"
    assert sqlstate(lambda: w.acquire("fn")) == "PF003", "a new worker is refused meanwhile"
    assert op.run("select resource, enabled, outcome from pgfence.finish_update(%s)",
                  (token,)) == [("fn", True, "restored")]
    [(_, step, _)] = start(w, acquired(w.acquire("fn")))
    assert step == "second"


def test_negative_control_a_draining_worker_judged_live_starts_during_the_window(
        flow: Database) -> None:
    flow.install_mutant("hold-current-live")
    two_steps(flow)
    w = flow.session("w")
    lease = acquired(w.acquire("fn"))
    [(attempt, _, _)] = start(w, lease)
    flow.sql("select pgfence.prepare_update(array['fn'], %s)", (uuid.uuid4(),))
    assert complete(w, attempt, "{}") == "accepted"
    assert [step for _, step, _ in start(w, lease)] == ["second"], "it started work in the window"


# -- arguments, grants and installs ------------------------------------------------------------

@pytest.mark.parametrize(("flow_slug", "queue"), [("nosuch", "nosuch"), ("two", "other"),
                                                  (None, "two")])
def test_bad_flows_and_queues_are_refused(flow: Database, flow_slug: str | None,
                                          queue: str) -> None:
    two_steps(flow)
    s = flow.session("s")
    lease = acquired(s.acquire("fn"))
    assert sqlstate(lambda: s.run("select * from pgfence_pgflow.start_tasks(%s, %s, %s, "
                                  "'30 seconds', 1)", (lease.lease_id, flow_slug, queue))) \
        == "22023"
    assert sqlstate(lambda: s.run("select pgfence_pgflow.complete_task(%s, '{}')",
                                  (uuid.uuid4(),))) == "22023"


# -- a start taken over is pruned with its lease (issue 40) -----------------------------------

def taken_over_start(db: Database) -> tuple[Session, uuid.UUID, uuid.UUID]:
    """A start under `old`, whose worker died; the task stalled and taken over under a new
    lease; the first start, its read and the old lease (superseded), two days old. Returns the
    session, the live start, and the old lease's id."""
    two_steps(db)
    w = db.session("w")
    old = acquired(w.acquire("fn", owner="old"))
    start(w, old, qty=1)
    db.expire(old)
    db.sql("select pgfence_test.stall_task('two', %s)", (msg_of(db, "first"),))
    [(fresh, step, _)] = start(w, acquired(w.acquire("fn", owner="new")), qty=1)
    assert step == "first", "the stalled task taken over"
    for table, column in (("pgfence_pgflow.attempts", "started_at"),
                          ("pgfence_pgmq.attempts", "read_at"), ("pgfence.leases", "ended_at")):
        db.sql(f"update {table} set {column} = {column} - interval '2 days' "
               "where lease_id = %s", (old.lease_id,))
    return w, fresh, old.lease_id


def test_a_taken_over_start_is_pruned_with_its_lease(flow: Database) -> None:
    w, fresh, old = taken_over_start(flow)
    pruned = dict(flow.sql("select * from pgfence.prune('1 day')"))
    assert (pruned["pgfence_pgflow.attempts"], pruned["pgfence_pgmq.attempts"],
            pruned["leases"]) == (1, 1, 1)
    assert flow.one("select count(*) from pgfence.leases where lease_id = %s", (old,)) == 0
    assert complete(w, fresh, "{}") == "accepted"


def test_negative_control_a_taken_over_start_pins_its_lease_for_ever(flow: Database) -> None:
    flow.install_mutant("pgflow-leases-any-open")
    _, _, old = taken_over_start(flow)
    assert dict(flow.sql("select * from pgfence.prune('1 day')"))["leases"] == 0
    assert flow.one("select count(*) from pgfence.leases where lease_id = %s", (old,)) == 1


SEARCH_PATH = ["search_path=pg_catalog, pg_temp"]


def test_only_pgfence_worker_may_call_the_layer(flow: Database) -> None:
    assert flow.sql("""
      select p.oid::regprocedure::text, has_function_privilege('public', p.oid, 'execute'),
             pg_has_role('pgfence_worker', 'usage')
               and has_function_privilege('pgfence_worker', p.oid, 'execute'),
             p.prosecdef, coalesce(p.proconfig, '{}')
        from pg_proc p where p.pronamespace = 'pgfence_pgflow'::regnamespace
       order by 1""") == [
        # Issue 25's maintenance and registration (operator's, not the workers').
        ("pgfence_pgflow.as_maintenance(text,interval)", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.check_allowed(regprocedure)", False, False, False, []),
        # Issue 45's batch: complete_many and fail_many over finish_many (each finish's rule).
        ("pgfence_pgflow.complete_many(uuid[],jsonb[])", False, True, False, []),
        ("pgfence_pgflow.complete_task(uuid,jsonb)", False, True, False, []),
        ("pgfence_pgflow.cron_commands()", False, False, False, SEARCH_PATH),
        ("pgfence_pgflow.enabled_changed(text[])", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.ensure_workers()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.fail_many(uuid[],text[])", False, True, False, []),
        ("pgfence_pgflow.fail_task(uuid,text)", False, True, False, []),
        ("pgfence_pgflow.finish(uuid,text,jsonb,text)", False, True, True,
         ["search_path=pg_catalog, pg_temp"]),
        ("pgfence_pgflow.finish_many(uuid[],text,jsonb[],text[])", False, True, True,
         ["search_path=pg_catalog, pg_temp"]),
        ("pgfence_pgflow.follow_resource()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.health()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.in_flight()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.job_problem(regprocedure,text)", False, False, False, SEARCH_PATH),
        ("pgfence_pgflow.leases()", False, False, True, SEARCH_PATH),
        # Issue 42's worker: pgflow's mark for a fenced worker's row, a pgflow attempt's set_vt.
        ("pgfence_pgflow.mark_worker_stopped(uuid)", False, True, True, SEARCH_PATH),
        ("pgfence_pgflow.open_starts()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.prune(interval)", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.prune_workers(interval)", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.requeue_stalled_tasks()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.set_vt(uuid,interval)", False, True, True, SEARCH_PATH),
        ("pgfence_pgflow.setup_cron()", False, False, False, SEARCH_PATH),
        ("pgfence_pgflow.stalled(timestamp with time zone,integer,boolean,boolean)", False, False,
         False, []),
        ("pgfence_pgflow.start_lease_live(uuid,text,integer,integer)", False, False, False, []),
        ("pgfence_pgflow.start_tasks(uuid,text,text,interval,integer)", False, True, True,
         ["search_path=pg_catalog, pg_temp"]),
        ("pgfence_pgflow.sync_workers()", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.undo_cron()", False, False, False, SEARCH_PATH),
        ("pgfence_pgflow.window_finish(uuid)", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.window_prepare(uuid,text[])", False, False, True, SEARCH_PATH),
        ("pgfence_pgflow.window_status(uuid,text[])", False, False, True, SEARCH_PATH),
    ]


def test_the_worker_row_never_shows_the_lease_id(flow: Database) -> None:
    two_steps(flow)
    w = flow.session("w")
    lease = acquired(w.acquire("fn"))
    start(w, lease)
    [(worker, function_name)] = flow.sql("select worker_id, function_name from pgflow.workers")
    assert function_name == "fn" and worker != lease.lease_id
    assert flow.one("select last_worker_id from pgflow.step_tasks where step_slug = 'first'") \
        == worker


# -- the task's input, the same on every pgflow --------------------------------------------------

def inputs_of_a_run(db: Database) -> list[tuple[str, Any]]:
    two_steps(db)
    w = db.session("w")
    lease = acquired(w.acquire("fn"))
    [(first, step, inp)] = start(w, lease)
    assert complete(w, first, '{"x": 1}') == "accepted"
    [(_, step2, inp2)] = start(w, lease)
    return [(step, inp), (step2, inp2)]


def test_a_tasks_input_has_the_run_input_and_its_dependencies_outputs(
        flow: Database, pgflow_version: str) -> None:
    """pgflow 0.14.1's own start_tasks gives a task its dependencies' outputs only (a root
    step's run input apart, as flow_input); 0.8.1's puts the run input under "run" beside
    them. The layer gives 0.8.1's shape on both."""
    own = flow.one("select exists (select from pg_attribute where attname = 'flow_input' "
                   "and attrelid = 'pgflow.step_task_record'::regclass)")
    assert own is (pgflow_version == "0.14.1")
    assert inputs_of_a_run(flow) == [("first", {"run": {"n": 1}}),
                                     ("second", {"run": {"n": 1}, "first": {"x": 1}})]


def test_negative_control_pgflow_014s_input_as_it_is(flow: Database, pgflow_version: str) -> None:
    if pgflow_version != "0.14.1":
        pytest.skip("pgflow 0.8.1's own input already has the run input: nothing to break")
    flow.install_mutant("pgflow-start-014-input-without-run")
    assert inputs_of_a_run(flow) == [("first", {}), ("second", {"first": {"x": 1}})]

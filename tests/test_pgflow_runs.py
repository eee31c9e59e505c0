"""The pgflow layer's rules of issue 25 against the real pgflow (npm @pgflow/core 0.8.1 and
0.14.1, the fixture pgflow_version of tests/conftest.py): a
started task's message stays hidden for its step's timeout + 2 s (no live task taken over); a
takeover counts against max_attempts; two results of one run never deadlock; the takeover takes
over only a task whose message came back. Each with its negative control, the same scenario
against a broken variant of the rule (as tests/mutation/mutants.toml breaks it).

Time passing is simulated: a message's visibility and its started task's start are moved back
(`shift_message`, or pgfence_test.stall_task past them), a lease expired with
pgfence_test.expire; blocking is
driven and observed with pg_blocking_pids(), never waited out.
"""

from __future__ import annotations

import uuid

from testkit.harness import Database, Lease, Session, sqlstate
from tests.support import acquired
from tests.test_pgflow import complete, fail, run_status, two_steps


def start(s: Session, lease: Lease, vt: str = "2 seconds", qty: int = 5,
          flow: str = "two") -> list[tuple[uuid.UUID, str]]:
    """(attempt_id, step_slug) of each task started, read with visibility ``vt``."""
    return [(a, step) for a, step in s.run(
        "select attempt_id, step_slug from pgfence_pgflow.start_tasks(%s, %s, %s, %s::interval, "
        "%s)", (lease.lease_id, flow, flow, vt, qty))]


def shift_message(db: Database, flow: str, seconds: int) -> None:
    """``seconds`` pass for every message of the flow's queue and every task of the flow that
    is started (its start moved back as much)."""
    db.sql(f"update pgmq.q_{flow} set vt = vt - make_interval(secs => %s)", (seconds,))
    db.sql("update pgflow.step_tasks set started_at = started_at - make_interval(secs => %s), "
           "queued_at = queued_at - make_interval(secs => %s) "
           "where flow_slug = %s and status = 'started'", (seconds, seconds, flow))


def tasks(db: Database, run_id: uuid.UUID) -> list[tuple[str, str, int]]:
    return [(str(step), str(status), int(n)) for step, status, n in db.sql(
        "select step_slug, status, attempts_count from pgflow.step_tasks where run_id = %s "
        "order by step_slug, task_index", (run_id,))]


# -- 1. visibility: a handler longer than the read's vt, within the step's timeout ------------

def two_functions(db: Database) -> tuple[uuid.UUID, Lease, Lease, Session, Session]:
    """Flow `two` (step `first` with a 10 s timeout), served by two worker functions, fn1 and
    fn2 (the rollout doc allows two on one flow), each holding its own lease."""
    db.sql("select pgflow.create_flow('two', max_attempts => 3)")
    db.sql("select pgflow.add_step('two', 'first', timeout => 10)")
    db.sql("select pgflow.add_step('two', 'second', array['first'])")
    for r in ("fn1", "fn2"):
        db.sql("select pgfence.register(%s)", (r,))
    run_id = uuid.UUID(str(db.one("select run_id from pgflow.start_flow('two', '{}')")))
    a, b = db.session("a"), db.session("b")
    return run_id, acquired(a.acquire("fn1")), acquired(b.acquire("fn2")), a, b


def test_a_live_task_is_not_taken_over_a_stalled_one_is(any_flow: Database) -> None:
    db = any_flow
    run_id, la, lb, a, b = two_functions(db)
    [(attempt, step)] = start(a, la)
    assert step == "first"
    # Hidden for the step's timeout + 2 s (12 s), not the read's 2 s: counted from the read,
    # in the same statement (from this later one, the interval shrank by however slow the
    # machine was between them).
    assert db.one("select vt - last_read_at between interval '12 seconds' "
                  "and interval '13 seconds' from pgmq.q_two") is True
    shift_message(db, "two", 3)                  # the handler runs 3 s: past vt, within 10 s
    assert start(b, lb) == [], "fn2 finds nothing: the task is live"
    assert complete(a, attempt, '{"by": "a"}') == "accepted"
    assert tasks(db, run_id) == [("first", "completed", 1), ("second", "queued", 0)]
    # A handler past the step's timeout: its task is taken over.
    [(second, _)] = start(a, la)
    shift_message(db, "two", 63)                 # past `second`'s timeout (the flow's 60 s) + 2
    assert [s for _, s in start(b, lb)] == ["second"]
    assert complete(a, second, '{"by": "a"}') == "stale"
    assert tasks(db, run_id)[1] == ("second", "started", 2)


def test_negative_control_with_the_reads_vt_only_a_live_task_is_taken_over(
        flow: Database) -> None:
    # Both rules that keep a live task its attempt's: the visibility the start gives its
    # message, and the takeover's test that it has stalled (each alone keeps it here).
    flow.install_mutant("pgflow-start-read-vt-only", "pgflow-takeover-not-stalled")
    run_id, la, lb, a, b = two_functions(flow)
    [(attempt, _)] = start(a, la)
    shift_message(flow, "two", 3)
    assert [s for _, s in start(b, lb)] == ["first"], "fn2 took the live task over"
    assert complete(a, attempt, '{"by": "a"}') == "stale", "and the live handler's result is lost"
    assert tasks(flow, run_id)[0] == ("first", "started", 2)


def early(db: Database) -> tuple[uuid.UUID, Session, Session, Lease, Lease]:
    """fn1's start of `first`; its message made visible at once, as by hand, an old binary's
    read or pgflow's own recovery job: (the attempt, a, b, la, lb)."""
    _, la, lb, a, b = two_functions(db)
    [(attempt, _)] = start(a, la)
    db.sql("update pgmq.q_two set vt = clock_timestamp()")
    return attempt, a, b, la, lb


def test_a_live_task_whose_message_came_back_early_is_not_taken_over(any_flow: Database) -> None:
    db = any_flow
    attempt, a, b, _, lb = early(db)
    assert start(b, lb) == [], "fn2 read the message, but the task has not stalled"
    assert db.one("select m.vt >= st.started_at + interval '12 seconds' from pgmq.q_two m "
                  "join pgflow.step_tasks st on st.message_id = m.msg_id") is True, \
        "hidden again until its start's deadline (the step's 10 s + 2 s)"
    assert complete(a, attempt, '{"by": "a"}') == "accepted"


def test_negative_control_a_takeover_of_any_task_whose_message_came_back(flow: Database) -> None:
    flow.install_mutant("pgflow-takeover-not-stalled")
    attempt, a, b, _, lb = early(flow)
    assert [s for _, s in start(b, lb)] == ["first"], "fn2 took the live task over"
    assert complete(a, attempt, '{"by": "a"}') == "stale"


# -- 2. takeovers count against max_attempts --------------------------------------------------

def stall_three_times(db: Database) -> tuple[uuid.UUID, list[uuid.UUID], list[tuple[uuid.UUID,
                                                                                    str]]]:
    """Flow `two` with max_attempts 2; `first` started by A, then by B after A stalled past its
    lease and the step's timeout, then polled by C after B stalled too: (run, [A's and B's
    attempts], what C started)."""
    run_id = two_steps(db)
    db.sql("update pgflow.flows set opt_max_attempts = 2 where flow_slug = 'two'")
    attempts = []
    for name in ("a", "b"):
        s = db.session(name)
        lease = acquired(s.acquire("fn"))
        [(attempt, _)] = start(s, lease)
        attempts.append(attempt)
        db.expire(lease)
        shift_message(db, "two", 63)
    c = db.session("c")
    return run_id, attempts, start(c, acquired(c.acquire("fn")))


def test_takeovers_count_against_max_attempts_to_the_final_failure(any_flow: Database) -> None:
    db = any_flow
    run_id, [a, b], started = stall_three_times(db)
    assert started == [], "no third attempt: max_attempts is 2"
    assert tasks(db, run_id) == [("first", "failed", 2)]
    assert run_status(db, run_id)[0] == "failed"
    assert "taken over after 2 attempts" in str(db.one(
        "select error_message from pgflow.step_tasks where run_id = %s", (run_id,)))
    # Both stalled attempts' late results are stale, and stay so.
    s = db.session("late")
    assert complete(s, a, '{"by": "a"}') == "stale"
    assert fail(s, b) == "stale"
    assert db.one("select count(*) from pgmq.q_two") == 0, "pgflow archived the message"


def test_negative_control_unbounded_takeovers_start_a_third_attempt(flow: Database) -> None:
    flow.install_mutant("pgflow-takeover-unbounded")
    run_id, _, started = stall_three_times(flow)
    assert [s for _, s in started] == ["first"]
    assert tasks(flow, run_id) == [("first", "started", 3)], "past max_attempts"


# -- 3. two results of one run, one failing it, never deadlock --------------------------------

def parallel(db: Database) -> tuple[uuid.UUID, dict[str, uuid.UUID]]:
    """Flow `par`: two root steps, `a` and `b`, no retries; one run, both tasks started."""
    db.sql("select pgflow.create_flow('par', max_attempts => 1)")
    db.sql("select pgflow.add_step('par', 'a')")
    db.sql("select pgflow.add_step('par', 'b')")
    db.sql("select pgfence.register('fn')")
    run_id = uuid.UUID(str(db.one("select run_id from pgflow.start_flow('par', '{}')")))
    w = db.session("w")
    started = {step: attempt for attempt, step in start(w, acquired(w.acquire("fn")),
                                                        flow="par")}
    assert set(started) == {"a", "b"}
    return run_id, started


def results_of_one_run(db: Database) -> tuple[uuid.UUID, list[object]]:
    """B's fail (which fails the run) queues for the run first, then A's complete; a third
    session held the run until both wait. The outcome of each: its verdict or its SQLSTATE."""
    run_id, started = parallel(db)
    a, b, holder = db.session("ra"), db.session("rb"), db.session("holder")
    holder.begin()
    holder.run("select from pgflow.runs where run_id = %s for update", (run_id,))
    failing = b.start("select pgfence_pgflow.fail_task(%s, 'boom')", (started["b"],))
    assert failing.settle() is True and failing.blocked_by == [holder.pid]
    completing = a.start("select pgfence_pgflow.complete_task(%s, '{}')", (started["a"],))
    assert completing.settle() is True
    holder.commit()
    outcomes: list[object] = []
    for step in (failing, completing):
        try:
            outcomes.append(step.one())
        except Exception:
            outcomes.append(sqlstate(step.result))
    return run_id, outcomes


def test_two_results_of_one_run_one_failing_it_both_get_verdicts(flow: Database) -> None:
    run_id, outcomes = results_of_one_run(flow)
    # Both held their tasks: both accepted, and pgflow applied each (the run failed first; a
    # completion in a failed run changes nothing of it).
    assert outcomes == ["accepted", "accepted"], outcomes
    assert run_status(flow, run_id)[0] == "failed"


def test_negative_control_results_without_the_run_lock_deadlock(flow: Database) -> None:
    flow.install_mutant("pgflow-finish-run-unlocked")
    _, outcomes = results_of_one_run(flow)
    assert "40P01" in outcomes, outcomes


# -- 4. the takeover takes over only a task whose message came back ---------------------------

def second_start_for_another_run(db: Database) -> tuple[uuid.UUID, str, str]:
    """A starts run 1's `first`, then, in a second start, run 2's; then reports run 1's:
    (run 1, the verdict, run 1's `first` status as A's second start left it)."""
    run1 = two_steps(db)
    db.sql("select pgflow.start_flow('two', '{\"n\": 2}')")
    a = db.session("a")
    lease = acquired(a.acquire("fn"))
    [(first, _)] = start(a, lease, qty=1)
    [(other, _)] = start(a, lease, qty=1)
    assert other != first
    status = str(db.one("select status from pgflow.step_tasks where run_id = %s "
                        "and step_slug = 'first'", (run1,)))
    return run1, complete(a, first, '{"by": "a"}'), status


def test_a_workers_second_start_leaves_its_first_task_alone(any_flow: Database) -> None:
    run1, verdict, status = second_start_for_another_run(any_flow)
    assert status == "started"
    assert verdict == "accepted"
    assert tasks(any_flow, run1) == [("first", "completed", 1), ("second", "queued", 0)]


def test_negative_control_a_takeover_of_every_started_task_loses_a_valid_result(
        flow: Database) -> None:
    # The takeover of only the tasks whose message this read got back, and of only those that
    # have stalled.
    flow.install_mutant("pgflow-takeover-any-started", "pgflow-takeover-not-stalled")
    _, verdict, status = second_start_for_another_run(flow)
    assert (status, verdict) == ("queued", "stale")


def stalled_task_not_read(db: Database) -> tuple[str, str]:
    """fn1 starts run 1's `first` and keeps its message for an hour (a long handler's set_vt),
    then goes silent past the step's timeout: the task has stalled (its lease ended, its
    timeout passed), its message still hidden. fn2 starts run 2's `first`. Run 1's `first`
    status as fn2's start left it, and fn1's late result."""
    run1, la, lb, a, b = two_functions(db)
    [(attempt, _)] = start(a, la, qty=1)
    assert a.one("select pgfence_pgflow.set_vt(%s, '1 hour') is not null", (attempt,)) is True
    db.expire(la)
    db.sql("update pgflow.step_tasks set started_at = started_at - interval '1 hour', "
           "queued_at = queued_at - interval '1 hour' where run_id = %s", (run1,))
    db.sql("select pgflow.start_flow('two', '{}')")
    assert [s for _, s in start(b, lb, qty=1)] == ["first"], "run 2's"
    status = str(db.one("select status from pgflow.step_tasks where run_id = %s "
                        "and step_slug = 'first'", (run1,)))
    return status, complete(a, attempt, '{"by": "a"}')


def test_a_start_takes_over_no_stalled_task_whose_message_it_did_not_read(
        any_flow: Database) -> None:
    # (Recovery, pgfence_pgflow.requeue_stalled_tasks, takes such a task back; a read does not.)
    assert stalled_task_not_read(any_flow) == ("started", "accepted")


def test_negative_control_a_takeover_of_any_stalled_task_loses_a_valid_result(
        flow: Database) -> None:
    flow.install_mutant("pgflow-takeover-any-started")
    assert stalled_task_not_read(flow) == ("queued", "stale")

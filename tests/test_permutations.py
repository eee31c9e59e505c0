"""Every interleaving of the core protocols (testkit.permutations, after PostgreSQL's isolation
tester): each scenario runs all orders of its sessions' steps, and every history must keep
I1, I2, I4 and I5 (and, for the update window, I6 and the pause). Each family of scenarios
has a negative control: a mutant of tests/mutation/mutants.toml that it catches.

Time passes by pgfence_test.expire, which moves a lease's expiry into the past. That is
faithful only to a caller that reads the lease row afresh (READ COMMITTED): a REPEATABLE READ
snapshot would still hold the later expiry, which real time never produces (renew never moves
expiry backwards). So at the stricter levels a lease ends by drain, release or deprecate, or
by real time passing (a short ttl, waited for on the database clock).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from testkit import invariants
from testkit.harness import Database
from testkit.permutations import Report, Scenario, Step, count, install, run, violations

LEVELS = ["read committed", "repeatable read", "serializable"]
def write(lease: str) -> str:
    """A protected write stamped with the generation fence returned, in one statement."""
    return (f"insert into pgfence_perm.writes select %({lease})s, 'r', pgfence.fence(%({lease})s),"
            " statement_timestamp()")


def claim(lease: str) -> str:
    return (f"insert into pgfence_perm.claimed select %({lease})s, c.task_id, c.attempt,"
            f" c.attempt_id, statement_timestamp() from pgfence.claim(%({lease})s, 'q') c"
            " returning attempt_id")


def result(kind: str, attempt: str) -> str:
    """complete, fail or extend of an attempt, its answer committed with it."""
    if kind == "extend":
        call = f"pgfence.extend(%({attempt})s, '30 s')::text"
    else:
        call = f"pgfence.{kind}(%({attempt})s, jsonb_build_object('by', %({attempt})s::text))"
    return f"insert into pgfence_perm.answers select %({attempt})s, '{kind}', {call}"


def begin(level: str) -> Step:
    # The snapshot is taken here, before anything else happens (REPEATABLE READ, SERIALIZABLE).
    return Step("a_begin", f"begin isolation level {level}; select count(*) from pgfence.leases")


def acquire(session: str, save: str) -> Step:
    return Step(f"{session}_acquire",
                f"select lease_id from pgfence.acquire('r', '{session}', '30 s')", save)


def lease(db: Database, owner: str = "a", ttl: str = "30 s") -> uuid.UUID:
    db.sql("select pgfence.register('r')")
    return uuid.UUID(str(db.one("select lease_id from pgfence.acquire('r', %s, %s::interval)",
                                (owner, ttl))))


def checked(db: Database, scenario: Scenario) -> Report:
    report = run(db, scenario)
    print(report)
    assert report.permutations + report.invalid + report.skipped == count(
        {s: len(steps) for s, steps in scenario.sessions.items()})
    assert report.permutations > 0
    return report


# ---- the core: fence (or claim) in a transaction, a takeover, and a third party ------------

C_STEPS = {
    "drain": Step("c_drain", "select pgfence.drain(%(la)s)"),
    "deprecate": Step("c_deprecate", "select pgfence.deprecate('r')"),
    "renew": Step("c_renew", "select pgfence.renew(%(la)s, '30 s')"),
    "claim": Step("c_claim", claim("la")),
}


def pgmq_read(lease: str) -> str:
    """A read of the pgmq layer, recorded as a claim (its message and read count)."""
    return (f"insert into pgfence_perm.claimed select %({lease})s, r.msg_id, r.read_ct,"
            f" r.attempt_id, statement_timestamp()"
            f" from pgfence_pgmq.read(%({lease})s, 'jobs', '30 seconds') r returning attempt_id")


WORK = {"write": Step("a_write", write("la")), "claim": Step("a_claim", claim("la")),
        "pgmq": Step("a_pgmq_read", pgmq_read("la"))}


def core(work: str, third: str, level: str = "read committed") -> Scenario:
    """A: begin → fence+write (or claim, or a pgmq read) → commit. B: A's lease expires →
    acquire → write. C: one drain, deprecate, renew or claim under A's lease."""
    def setup(db: Database) -> dict[str, Any]:
        db.sql("select pgfence.enqueue('q'); select pgfence.enqueue('q')")
        if work == "pgmq":
            db.sql("select pgmq.create('jobs'); select pgmq.purge_queue('jobs');"
                   " select pgmq.send('jobs', '{}')")
        return {"la": lease(db)}
    a_work = WORK[work]
    presents = {"a": "la", "b": "lb"} | ({} if third == "deprecate" else {"c": "la"})
    # Every interleaving on every version: the meetings alone miss the negative controls below
    # (a check without its lock shows only when B's expiry and acquire both fall between A's
    # write and commit, with C after A's write: more than one meeting at once).
    return Scenario(
        f"core {work}/{third} ({level})",
        sessions={"a": (begin(level), a_work, Step("a_commit", "commit")),
                  "b": (Step("b_expires", "select pgfence_perm.time_passes(%(la)s)"),
                        acquire("b", "lb"), Step("b_write", write("lb"))),
                  "c": (C_STEPS[third],)},
        setup=setup, presents=presents, cover="all")


# fence and claim share their lease check (pgfence.hold_current): claim is run against the
# drain, the third party that ends its lease, and fence against all of them.
@pytest.mark.parametrize(("work", "third"), [("write", t) for t in C_STEPS] + [("claim", "drain")])
def test_core_every_interleaving(db: Database, work: str, third: str) -> None:
    report = checked(db, core(work, third))
    assert report.permutations + report.invalid + report.skipped == 140
    assert not report.violations, report.violations[:3]


@pytest.mark.parametrize(("work", "mutant"), [
    ("write", "hold-current-no-lock"),
    # The survivor of the audit: claim's check without its lock, inside a longer transaction.
    ("claim", "claim-check-without-lock"),
])
def test_negative_control_core_catches_a_check_without_its_lock(db: Database, work: str,
                                                                 mutant: str) -> None:
    db.install_mutant(mutant)
    report = checked(db, core(work, "drain"))
    assert any("after generation" in v for _, found in report.violations for v in found)


@pytest.mark.parametrize("mutant", [None, "pgmq-read-check-without-lock"])
def test_core_every_interleaving_of_a_pgmq_read(request: pytest.FixtureRequest,
                                                 mutant: str | None) -> None:
    # A pgmq read inside a longer transaction holds its lease as claim does; the negative
    # control reads after a check that holds nothing.
    mq: Database = request.getfixturevalue("mq")  # tests/conftest.py, with the layer
    if mutant:
        mq.install_mutant(mutant)
    report = checked(mq, core("pgmq", "drain"))
    if mutant:
        assert any("after generation" in v for _, found in report.violations for v in found)
    else:
        assert not report.violations, report.violations[:3]


def test_negative_control_core_catches_a_renewal_of_another_lease(db: Database) -> None:
    db.install_mutant("renew-by-resource")
    report = checked(db, core("write", "renew"))
    assert any(v.startswith("I4:") for _, found in report.violations for v in found)


# ---- the core at REPEATABLE READ and SERIALIZABLE ------------------------------------------

ENDS = {
    "drain": Step("c_drain", "select pgfence.drain(%(la)s)"),
    "release": Step("c_release", "select pgfence.release(%(la)s)"),
    "deprecate": Step("c_deprecate", "select pgfence.deprecate('r')"),
}


def ended(work: str, end: str, level: str) -> Scenario:
    """A (at level): begin, with its snapshot → fence+write (or claim) → commit. C: A's lease
    ends. B: acquire → write. 40001 is an acceptable refusal; a stale lease passing is not."""
    def setup(db: Database) -> dict[str, Any]:
        db.sql("select pgfence.enqueue('q')")
        return {"la": lease(db)}
    a_work = Step("a_write", write("la")) if work == "write" else Step("a_claim", claim("la"))
    presents = {"a": "la", "b": "lb"} | ({} if end == "deprecate" else {"c": "la"})
    return Scenario(
        f"ended {work}/{end} ({level})",
        sessions={"a": (begin(level), a_work, Step("a_commit", "commit")),
                  "b": (acquire("b", "lb"), Step("b_write", write("lb"))),
                  "c": (ENDS[end],)},
        setup=setup, presents=presents)


@pytest.mark.parametrize("level", LEVELS[1:])
@pytest.mark.parametrize(("work", "end"), [("write", e) for e in ENDS] + [("claim", "drain")])
def test_stricter_levels_every_interleaving_of_an_ended_lease(db: Database, work: str,
                                                             end: str, level: str) -> None:
    report = checked(db, ended(work, end, level))
    assert not report.violations, report.violations[:3]


def test_negative_control_repeatable_read_catches_a_drain_without_for_update(
        db: Database) -> None:
    db.install_mutant("drain-no-key-update")
    report = checked(db, ended("write", "drain", "repeatable read"))
    assert report.violations


def expiring(work: str, level: str, ttl_ms: int = 100,
             landed: list[bool] | None = None) -> Scenario:
    """A (at level): begin → fence+write (or claim) → commit, with a lease of 100 ms. B: waits
    on the database clock until that lease has expired → acquire → write. ``landed`` gets,
    for each permutation, whether A's work committed under its lease."""
    def setup(db: Database) -> dict[str, Any]:
        db.sql("select pgfence.enqueue('q')")
        la = lease(db, ttl=f"{ttl_ms} ms")
        until = db.one("select expires_at from pgfence.leases where lease_id = %s", (la,))
        return {"la": la, "until": until}

    def check(db: Database, ctx: dict[str, Any]) -> list[str]:
        if landed is not None:
            table = "writes" if work == "write" else "claimed"
            landed.append(bool(db.one(f"select exists (select from pgfence_perm.{table} "
                                      "where lease_id = %s)", (ctx["la"],))))
        return []
    a_work = Step("a_write", write("la")) if work == "write" else Step("a_claim", claim("la"))
    return Scenario(
        f"expiring {work} ({level}, {ttl_ms} ms)",
        sessions={"a": (begin(level), a_work, Step("a_commit", "commit")),
                  # Time passing: the wait stands for it and decides nothing.
                  "b": (Step("b_expires", "select pgfence_perm.wait_past(%(until)s)"),
                        acquire("b", "lb"), Step("b_write", write("lb")))},
        setup=setup, presents={"a": "la", "b": "lb"}, check=check)


@pytest.mark.parametrize(("work", "level"), [("write", "repeatable read"),
                                             ("claim", "serializable")])
def test_stricter_levels_every_interleaving_of_an_expiring_lease(db: Database, work: str,
                                                                 level: str) -> None:
    # The orders where A's work lands before its lease runs out are what this is about. On a
    # machine too slow for A's first steps within 100 ms every fence is refused, and the
    # histories, all valid, would test nothing: such a lease is given again, four times longer.
    for ttl_ms in (100, 400, 1600, 6400):
        landed: list[bool] = []
        report = checked(db, expiring(work, level, ttl_ms, landed))
        assert report.permutations + report.invalid + report.skipped == 20
        assert not report.violations, report.violations[:3]
        if any(landed):
            break
    assert any(landed), "A's work never landed under its lease: the scenario did not happen"


# ---- the tasks: a result of the old owner racing a takeover, requeue and a new claim -------

def tasks(kind: str, level: str = "read committed") -> Scenario:
    """A (holds attempt a1): begin → complete, fail or extend a1 → commit. B: A's lease and
    a1's visibility run out and B acquires → begin → requeue_expired → claim (a2) → commit →
    complete a2."""
    def setup(db: Database) -> dict[str, Any]:
        la = lease(db)
        db.sql("select pgfence.enqueue('q', '{}', 3)")
        a1 = db.one(claim("la"), {"la": la})
        return {"la": la, "a1": a1}
    return Scenario(
        f"tasks {kind} ({level})",
        sessions={"a": (begin(level), Step(f"a_{kind}", result(kind, "a1")),
                        Step("a_commit", "commit")),
                  "b": (Step("b_takeover", "select pgfence_perm.takeover(%(la)s, %(a1)s, 'b')",
                             "lb"),
                        Step("b_begin", "begin"),
                        Step("b_requeue", "select pgfence.requeue_expired()"),
                        Step("b_claim", claim("lb"), "a2"),
                        Step("b_commit", "commit"),
                        Step("b_complete", result("complete", "a2")))},
        setup=setup, presents={"a": "la", "b": "lb"})


@pytest.mark.parametrize(("kind", "level"), [(k, lv) for k in ["complete", "fail", "extend"]
                                             for lv in ["read committed", "serializable"]]
                         + [("complete", "repeatable read")])
def test_tasks_every_interleaving(db: Database, kind: str, level: str) -> None:
    report = checked(db, tasks(kind, level))
    assert not report.violations, report.violations[:3]


@pytest.mark.parametrize(("kind", "mutant"), [
    ("fail", "report-no-row-lock"),
    ("extend", "extend-no-row-lock"),
    ("extend", "requeue-no-row-lock"),
])
def test_negative_control_tasks_catch_a_result_without_its_row_lock(db: Database, kind: str,
                                                                    mutant: str) -> None:
    db.install_mutant(mutant)
    report = checked(db, tasks(kind))
    assert any(v.startswith("I5:") for _, found in report.violations for v in found)


# ---- the update window against a fenced owner and a worker's start ------------------------

def window_check(db: Database, ctx: dict[str, Any]) -> list[str]:
    out = [f"paused: generation {g} granted at {at}, inside the window" for g, at in db.sql("""
        select l.generation, l.acquired_at from pgfence.leases l, pgfence.updates u
         where l.acquired_at between u.prepared_at and coalesce(u.finished_at, 'infinity')""")]
    out += [f"paused: invocation requested at {at}, inside the window" for (at,) in db.sql("""
        select i.requested_at from pgfence.invocations i, pgfence.updates u
         where i.requested_at between u.prepared_at and coalesce(u.finished_at, 'infinity')""")]
    out += [f"I6: {r} is enabled={e} after its window ({outcome}), saved {saved}"
            for r, e, outcome, saved in db.sql("""
        select r.resource, r.enabled, i.outcome, i.saved_enabled
          from pgfence.update_items i join pgfence.resources r using (resource)
         where r.enabled is distinct from (i.saved_enabled and i.outcome is not null)""")]
    return out


def window(enabled: bool) -> Scenario:
    """W (owner of la): begin → fence+write → commit. OP: prepare_update → finish_update.
    S (a worker starting): request_start → acquire with that invocation."""
    def setup(db: Database) -> dict[str, Any]:
        la = lease(db)
        if not enabled:
            db.sql("select pgfence.set_enabled('r', false)")
        return {"la": la, "rid": uuid.uuid4()}
    return Scenario(
        f"window (enabled {enabled})",
        sessions={"w": (Step("w_begin", "begin"), Step("w_write", write("la")),
                        Step("w_commit", "commit")),
                  "op": (Step("op_prepare", "select pgfence.prepare_update(array['r'], %(rid)s)",
                              "token"),
                         Step("op_finish",
                              "select count(*) from pgfence.finish_update(%(token)s)")),
                  "s": (Step("s_start", "select pgfence.request_start('r')", "inv"),
                        Step("s_acquire", "select lease_id from pgfence.acquire('r', 's', '30 s',"
                                          " %(inv)s)", "ls"))},
        setup=setup, presents={"w": "la", "s": "ls"}, check=window_check)


@pytest.mark.parametrize("enabled", [True, False])
def test_update_window_every_interleaving(db: Database, enabled: bool) -> None:
    report = checked(db, window(enabled))
    assert report.permutations + report.invalid + report.skipped == 210
    assert not report.violations, report.violations[:3]


@pytest.mark.parametrize(("enabled", "mutant"), [
    (True, "prepare-update-no-key-update"),
    (False, "finish-always-enables"),
])
def test_negative_control_update_window(db: Database, enabled: bool, mutant: str) -> None:
    db.install_mutant(mutant)
    report = checked(db, window(enabled))
    assert report.violations


# ---- the checks themselves ------------------------------------------------------------------

def test_negative_control_each_check_flags_a_history_that_breaks_it(db: Database) -> None:
    """A forged history, one breach per rule the mutants above do not already show failing."""
    install(db)
    g = "(select last_value + 1000 from pgfence.generation)"
    db.sql(f"""
        select pgfence.register('r'), pgfence.enqueue('q');
        -- I1: generation +2 granted 5 s into the term of generation +1, which ended at 10 s.
        insert into pgfence.leases (lease_id, resource, generation, owner, state, acquired_at,
                                    expires_at, ended_at)
        values ('00000000-0000-0000-0000-000000000001', 'r', {g}, 'x', 'superseded',
                now() - interval '60 s', now() - interval '30 s', now() - interval '50 s'),
               ('00000000-0000-0000-0000-000000000002', 'r', {g} + 1, 'y', 'active',
                now() - interval '55 s', now() + interval '30 s', null);
        -- I2: a write stamped with another generation than its lease's, begun after its term.
        select set_config('session_replication_role', 'replica', true);
        insert into pgfence_perm.writes
        values ('00000000-0000-0000-0000-000000000001', 'r', 1, now());
        -- I5: told stale, not recorded; a completed task holding someone else's result.
        insert into pgfence_perm.answers
        values ('00000000-0000-8001-9000-000000000000', 'complete', 'stale');
        update pgfence.tasks set state = 'completed', attempt = 1, result = '{{"by": "x"}}',
               lease_id = '00000000-0000-0000-0000-000000000002';
    """)
    found = violations(db, Scenario("forged", {}, setup=lambda _: {}), {})
    for rule in ["I1: r: generation", "I2: a write stamped generation", "I2: write of generation",
                 "I5: complete of", "I5: task"]:
        assert any(v.startswith(rule) for v in found), (rule, found)


def test_negative_control_the_layers_checks_flag_a_history_that_breaks_them(
        db: Database) -> None:
    """The checks the fault campaign's layers rely on (tests/campaign/database.py), over a
    forged history in views of its shape: work named by text (a pgmq message, a pgflow step
    task), each layer's stale results, handler runs, pgflow's starts again."""
    db.sql("""
        create schema forged;
        create view forged.runs (task_id, attempt) as
          values ('message 1', 1), ('message 1', 1), ('message 1', 2);
        create view forged.holders (task_id, attempt, state, result_by, holders_result) as
          values ('run r step first', 2, 'completed', '1', false),
                 ('message 1', 2, 'queued', null, null);
        create view forged.stale (attempt_id, task_id, attempt) as
          values (null::uuid, 'run r step first', 2);
        create view forged.results (attempt_id, task_id, attempt, kind, outcome, committed_at) as
          values (null::uuid, 'message 1', 1, 'complete', 'stale', now());
        create view forged.requeues (task_id, at, by, visible_until) as
          values ('run r step first', now(), 'edge-x', now() + interval '1 s');
    """)
    found = [f"{i}: {s}" for i, s in invariants.judge(
        db.sql, "forged", ("runs", "holders", "stale", "results", "requeues"))]
    for rule in ["I5: task message 1: the handler of attempt 1 ran 2 times",
                 "I5: task run r step first completed with the result of 1, not of its attempt 2",
                 "I5: task run r step first: a result of attempt 2 is recorded stale",
                 "I5: complete of attempt 1 of task message 1 was told stale",
                 "I5: task run r step first requeued at"]:
        assert any(v.startswith(rule) for v in found), (rule, found)
    assert not any("message 1: the handler of attempt 2" in v for v in found), found

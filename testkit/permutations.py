"""Every interleaving of a bounded scenario, after PostgreSQL's isolation tester.

A scenario names 2-3 sessions with a few steps each. :func:`run` runs every order of the steps
that keeps each session's own order (all permutations, the isolation tester's default), each
from the same starting state. A step that waits on a lock (``pg_blocking_pids()``, never a
sleep) is left waiting while the others go on, and completes when it is unblocked; a
permutation whose next step belongs to a session that is still waiting cannot happen, and is
counted as invalid and skipped, as the isolation tester does. After each permutation the
committed history is judged (I1, I2, I4, I5 and what the scenario adds) from the database's
own records: lease rows, rows written in the same transaction as the work they stand for
(``pgfence_perm.writes``, ``claimed``, ``answers``), row changes logged by triggers, and commit
times (``pg_xact_commit_timestamp``, so ``track_commit_timestamp`` must be on), by the checks
of testkit.invariants, which judge the fault campaign's histories too.

    scenario = Scenario("core", sessions={"a": (...), "b": (...)}, setup=..., presents=...)
    report = run(db, scenario)
    assert report.permutations == 20 and not report.violations

``run(db, scenario, cover="meetings")`` runs fewer: orders chosen until each step has met each
other session at every point of that session where it can meet it (step j of session t run
when session s had run exactly k of its steps) in at least one run that was judged
(:class:`MeetingCover`). What a step meets there (a lock held or not yet, a commit before or
after its snapshot) is what differs between server versions. The test suite runs every
interleaving on the first version of its matrix and the meetings on the others
(``--interleavings``, tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from pgfence.connection import connect
from testkit import invariants
from testkit.harness import Database, Session
from testkit.harness import Step as Running

Cover = Literal["all", "meetings"]
# What run() does when not told: "all", unless the test suite is told otherwise.
COVER: Cover = "all"


@dataclass(frozen=True)
class Step:
    """One statement of a session. ``sql`` takes the context's values as ``%(name)s``; the
    first value the step returns (None if no row, or on an error) is saved as ``save``."""

    name: str
    sql: str
    save: str | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    sessions: Mapping[str, tuple[Step, ...]]
    # Sets the starting state (after the reset) and returns the context: lease ids, attempt ids.
    setup: Callable[[Database], dict[str, Any]]
    # The context key of the lease each worker session presents (I4: it changes no other);
    # sessions not named here are operators, who may drain any lease.
    presents: Mapping[str, str] = field(default_factory=dict)
    # Further checks of the committed history: sentences, one per violation.
    check: Callable[[Database, dict[str, Any]], list[str]] | None = None
    # "all" where the meetings are not enough: where a negative control is not caught by them.
    cover: Cover | None = None


@dataclass
class Report:
    scenario: str
    cover: Cover = "all"
    permutations: int = 0   # run to the end and judged
    invalid: int = 0        # a step of a session that was still waiting came up
    skipped: int = 0        # cover="meetings": not run (nothing new, or a known invalid start)
    violations: list[tuple[str, list[str]]] = field(default_factory=list)

    def __str__(self) -> str:
        skipped = (f", {self.skipped} not needed to cover the meetings"
                   if self.cover == "meetings" else "")
        return (f"{self.scenario}: {self.permutations} permutations run, {self.invalid} invalid "
                f"(a step of a waiting session){skipped}, {len(self.violations)} with a violation")


def interleavings(lengths: Mapping[str, int]) -> Iterator[tuple[str, ...]]:
    """Every sequence in which session s occurs lengths[s] times, in a fixed order."""
    if not any(lengths.values()):
        yield ()
        return
    for s in sorted(lengths):
        if lengths[s]:
            rest = dict(lengths, **{s: lengths[s] - 1})
            for tail in interleavings(rest):
                yield (s, *tail)


def count(lengths: Mapping[str, int]) -> int:
    """How many interleavings there are: the multinomial coefficient."""
    n, total = 1, 0
    for k in lengths.values():
        for i in range(1, k + 1):
            total += 1
            n = n * total // i
    return n


Order = tuple[str, ...]
Meeting = tuple[str, int, str, int]  # step j of session t ran after exactly k steps of s


def meetings(order: Order) -> frozenset[Meeting]:
    """For each step of ``order`` and each other session: how far that session had got."""
    done = dict.fromkeys(order, 0)
    out = set()
    for t in order:
        out |= {(t, done[t], s, k) for s, k in done.items() if s != t}
        done[t] += 1
    return frozenset(out)


class MeetingCover:
    """Chooses interleavings until each meeting that can happen has been run once.

    Greedy: next is an interleaving with the most meetings not yet judged. Whether a meeting
    can happen is learnt by running: a run that is invalid at its k-th step (a step of a
    waiting session came up) makes every interleaving that starts with the same k steps invalid
    too (the same steps from the same state wait the same way), so those are never tried, and
    only valid runs count as covering. It stops when no interleaving left could add a
    meeting, so every meeting of some valid interleaving is covered.
    """

    def __init__(self, lengths: Mapping[str, int]) -> None:
        self.todo = {order: meetings(order) for order in interleavings(lengths)}
        self.covered: set[Meeting] = set()
        self.dead: set[Order] = set()  # starts of invalid runs

    def next(self) -> Order | None:
        best, gain = None, 0
        for order, ps in self.todo.items():
            new = len(ps - self.covered)
            if new > gain and not any(order[:k] in self.dead for k in range(1, len(order) + 1)):
                best, gain = order, new
        if best is not None:
            del self.todo[best]
        return best

    def ran(self, order: Order, invalid_at: int | None) -> None:
        """Records a run: valid (None), or invalid when its step at index invalid_at came up."""
        if invalid_at is None:
            self.covered |= meetings(order)
        else:
            self.dead.add(order[:invalid_at + 1])


SCHEMA = """
create schema if not exists pgfence_perm;
-- Work done under a lease, each row written in the same transaction as the work itself, so it
-- commits with it or not at all: protected writes, claims, and what complete/fail/extend said.
create table pgfence_perm.writes (lease_id uuid, resource text, generation bigint,
                                  not_before timestamptz);
create table pgfence_perm.claimed (lease_id uuid, task_id bigint, attempt int, attempt_id uuid,
                                   not_before timestamptz);
create table pgfence_perm.answers (attempt_id uuid, kind text, answer text);
-- Every change of a lease or task row, with who made it (the session's application_name) and
-- whether it was the test's clock helper (time passing, not a pgfence call).
create table pgfence_perm.lease_changes (lease_id uuid, old_state text, new_state text,
                                         old_expires_at timestamptz, new_expires_at timestamptz,
                                         old_renewed_at timestamptz, new_renewed_at timestamptz,
                                         by text, at timestamptz, time_passes boolean);
create table pgfence_perm.task_changes (task_id bigint, old_state text, new_state text,
                                        old_visible_until timestamptz, new_reported boolean,
                                        by text, at timestamptz, time_passes boolean);
create function pgfence_perm.log_lease() returns trigger language plpgsql as $$
begin
  insert into pgfence_perm.lease_changes
  values (new.lease_id, old.state, new.state, old.expires_at, new.expires_at, old.renewed_at,
          new.renewed_at, current_setting('application_name'), clock_timestamp(),
          coalesce(current_setting('pgfence_perm.time_passes', true), '') = 'on');
  return null;
end $$;
create trigger log after update on pgfence.leases for each row
  execute function pgfence_perm.log_lease();
create function pgfence_perm.log_task() returns trigger language plpgsql as $$
begin
  insert into pgfence_perm.task_changes
  values (new.task_id, old.state, new.state, old.visible_until, new.reported,
          current_setting('application_name'), clock_timestamp(),
          coalesce(current_setting('pgfence_perm.time_passes', true), '') = 'on');
  return null;
end $$;
create trigger log after update on pgfence.tasks for each row
  execute function pgfence_perm.log_task();
-- Time passes for the owner of a lease, and for the handler of an attempt (either may be NULL).
create function pgfence_perm.time_passes(lease_id uuid, attempt_id uuid default null)
returns void language plpgsql as $$
begin
  perform set_config('pgfence_perm.time_passes', 'on', true);
  -- As pgfence_test.expire and expire_attempt, but to this very moment: steps follow each
  -- other within a millisecond, and the end of a term must not precede the step before.
  update pgfence.leases l set expires_at = least(l.expires_at, clock_timestamp())
   where l.lease_id = time_passes.lease_id;
  if attempt_id is not null then
    update pgfence.tasks t set visible_until = least(t.visible_until, clock_timestamp())
      from pgfence.attempt_of(time_passes.attempt_id) a
     where t.task_id = a.task_id and t.attempt = a.attempt;
  end if;
  perform set_config('pgfence_perm.time_passes', '', true);
end $$;
-- The writes are protected for resource r (the guard stays when a reset deletes the rows).
select pgfence.register('r');
select pgfence.protect('pgfence_perm.writes', 'r');
-- Time passes, and another owner acquires the resource: one step where the order of the two
-- is not what a scenario is about.
create function pgfence_perm.takeover(lease_id uuid, attempt_id uuid, owner text)
returns uuid language plpgsql as $$
begin
  perform pgfence_perm.time_passes(lease_id, attempt_id);
  return (select a.lease_id from pgfence.acquire('r', owner, '30 s') a);
end $$;
-- Real time passing, for callers whose snapshot must not see expiry moved back: waits on the
-- database clock until it is later than t.
create function pgfence_perm.wait_past(t timestamptz) returns void language plpgsql as $$
begin
  while clock_timestamp() <= t loop perform pg_sleep(0.002); end loop;
end $$;
-- The history as testkit.invariants reads it.
create view pgfence_perm.leases as
  select l.resource, l.generation, l.lease_id, l.acquired_at,
         least(l.drained_at, l.ended_at, l.expires_at) as term_end,
         least(l.drained_at, l.ended_at) as ended
    from pgfence.leases l;
create view pgfence_perm.work as
  select 'write'::text as what, w.resource, w.generation, w.lease_id, w.not_before,
         pg_xact_commit_timestamp(w.xmin) as committed_at
    from pgfence_perm.writes w
  union all
  select 'claim', l.resource, l.generation, c.lease_id, c.not_before,
         pg_xact_commit_timestamp(c.xmin)
    from pgfence_perm.claimed c join pgfence.leases l on l.lease_id = c.lease_id;
create view pgfence_perm.results as
  select r.attempt_id, a.task_id, a.attempt, r.kind, r.answer as outcome,
         pg_xact_commit_timestamp(r.xmin) as committed_at
    from pgfence_perm.answers r left join lateral pgfence.attempt_of(r.attempt_id) a on true;
create view pgfence_perm.holders as
  select t.task_id, t.attempt, t.state, t.result->>'by' as result_by,
         t.result->>'by' = pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id)::text
           as holders_result
    from pgfence.tasks t;
create view pgfence_perm.claims as
  select c.task_id, c.attempt, pg_xact_commit_timestamp(c.xmin) as committed_at
    from pgfence_perm.claimed c;
create view pgfence_perm.stale as
  select s.attempt_id, s.task_id, s.attempt from pgfence.stale_results s;
create view pgfence_perm.requeues as
  select c.task_id, c.at, c.by, c.old_visible_until as visible_until
    from pgfence_perm.task_changes c
   where c.old_state = 'claimed' and c.new_state in ('queued', 'failed') and not c.new_reported
     and not c.time_passes;
"""

# The views of the history above that testkit.invariants reads: all but runs (a scenario's
# steps are no handler runs; the fault campaign records those).
RECORDED = ("leases", "work", "results", "holders", "claims", "requeues", "stale")

# Every row pgfence holds but the signing key, and the records of the checks: deletes, which
# cost far less than a truncate on tables this small. One implicit transaction; the guard of
# the protected writes table does not fire (replica mode disables ordinary triggers).
RESET = """
select set_config('session_replication_role', 'replica', true);
delete from pgfence.update_items; delete from pgfence.updates; delete from pgfence.invocations;
delete from pgfence.leases; delete from pgfence.tasks; delete from pgfence.stale_results;
delete from pgfence.unfenced_writes; delete from pgfence.protections; delete from pgfence.resources;
delete from pgfence_perm.writes; delete from pgfence_perm.claimed; delete from pgfence_perm.answers;
delete from pgfence_perm.lease_changes; delete from pgfence_perm.task_changes;
"""

def check_i4(db: Database, scenario: Scenario, ctx: Mapping[str, Any]) -> list[str]:
    """I4: a worker session changes only the lease it presents, but for superseding a stale
    lease when it acquires."""
    presented = [(session, key, ctx.get(key)) for session, key in scenario.presents.items()]
    if not presented:
        return []
    rows = db.sql("""
        select format('I4: session %%s, presenting %%s, changed lease %%s (%%s -> %%s)',
                      p.session, p.key, c.lease_id, c.old_state, c.new_state)
          from pgfence_perm.lease_changes c
          join jsonb_to_recordset(%s) as p(session text, key text, lease_id uuid)
            on p.session = c.by
         where not c.time_passes and c.lease_id is distinct from p.lease_id
           and not (c.old_state = 'active' and c.new_state = 'superseded'
                    and c.old_expires_at <= c.at)""",
                  (Jsonb([{"session": s, "key": k, "lease_id": str(v) if v else None}
                          for s, k, v in presented]),))
    return [sentence for (sentence,) in rows]


def violations(db: Database, scenario: Scenario, ctx: Mapping[str, Any]) -> list[str]:
    """Every violation of the committed history, as a sentence: testkit.invariants' checks
    over pgfence_perm's views, I4, and what the scenario adds."""
    out = [f"{invariant}: {sentence}"
           for invariant, sentence in invariants.judge(db.sql, "pgfence_perm", RECORDED)]
    out += check_i4(db, scenario, ctx)
    if scenario.check is not None:
        out += scenario.check(db, dict(ctx))
    return out


def install(db: Database) -> None:
    """The schema pgfence_perm of the checks, once per database (pgfence_test must be there)."""
    if db.one("show track_commit_timestamp") != "on":
        raise RuntimeError("track_commit_timestamp is off: commit order cannot be judged "
                           "(testkit.cluster starts clusters with it on)")
    if not db.one("select exists (select from pg_namespace where nspname = 'pgfence_perm')"):
        db.sql(SCHEMA)


class _Permutation:
    def __init__(self, db: Database, scenario: Scenario, sessions: dict[str, Session],
                 ctx: dict[str, Any]) -> None:
        self.db = db
        self.scenario = scenario
        self.sessions = sessions
        self.ctx = ctx
        self.waiting: dict[str, tuple[Step, Running]] = {}
        self.log: list[str] = []

    def step(self, name: str, step: Step) -> None:
        params = dict(self.ctx) if "%(" in step.sql else None
        running = Running(self.sessions[name], step.sql, params)
        if running.settle():
            self.waiting[name] = (step, running)
            self.log.append(f"{step.name} waits")
        else:
            self._done(step, running)
        self.settle()

    def settle(self) -> None:
        """Lets every step that a finished one unblocked finish (or wait again)."""
        changed = True
        while changed:
            changed = False
            for name, (step, running) in list(self.waiting.items()):
                if not running.settle():
                    del self.waiting[name]
                    self._done(step, running)
                    changed = True

    def _done(self, step: Step, running: Running) -> None:
        try:
            rows = running.result()
            value = rows[0][0] if rows and rows[0] else None
            self.log.append(step.name)
        except Exception as e:  # a refusal is an outcome, judged by the checks
            value = None
            self.log.append(f"{step.name}: {getattr(e, 'sqlstate', None) or type(e).__name__}")
        if step.save:
            self.ctx[step.save] = value

    def end(self) -> None:
        """Every session back outside a transaction: the idle ones roll back, which unblocks
        the waiting ones; until none is left waiting."""
        for _ in range(10):
            for name, session in self.sessions.items():
                if name not in self.waiting:
                    try:
                        if session.conn.info.transaction_status != TransactionStatus.IDLE:
                            session.rollback()
                    except psycopg.Error:
                        # Ended by the server (25P03): the idle limit fence sets, for an owner
                        # that idled inside its fenced transaction past its lease's expiry.
                        session.conn.close()
                    if session.conn.closed:
                        session.conn = connect(self.db.dsn, session.name)
            if not self.waiting:
                return
            self.settle()
        raise AssertionError(f"steps still waiting after every session ended: {self.log}")


def run(db: Database, scenario: Scenario, cover: Cover | None = None) -> Report:
    """Runs every permutation of ``scenario`` on ``db`` (or, cover="meetings", those that
    cover every meeting: :class:`MeetingCover`); the report lists the violations."""
    install(db)
    # Named as the checks know them (application_name): unique in the cluster while it runs.
    sessions = {name: db.session(name) for name in scenario.sessions}
    report = Report(scenario.name, cover or scenario.cover or COVER)
    lengths = {name: len(steps) for name, steps in scenario.sessions.items()}
    try:
        if report.cover == "all":
            for order in interleavings(lengths):
                _run(db, scenario, sessions, order, report)
        else:
            chooser = MeetingCover(lengths)
            while (chosen := chooser.next()) is not None:
                chooser.ran(chosen, _run(db, scenario, sessions, chosen, report))
            report.skipped = count(lengths) - report.permutations - report.invalid
        return report
    finally:
        for s in sessions.values():
            s.close()


def _run(db: Database, scenario: Scenario, sessions: dict[str, Session], order: Order,
         report: Report) -> int | None:
    """One permutation, judged into ``report``; the index of the step that made it invalid."""
    saves = {st.save: None for steps in scenario.sessions.values() for st in steps if st.save}
    db.sql(RESET)
    ctx: dict[str, Any] = {**saves, **scenario.setup(db)}
    p = _Permutation(db, scenario, sessions, ctx)
    next_step = dict.fromkeys(scenario.sessions, 0)
    invalid_at = None
    for k, name in enumerate(order):
        if name in p.waiting:
            invalid_at = k
            break
        p.step(name, scenario.sessions[name][next_step[name]])
        next_step[name] += 1
    stuck = [st.name for st, _ in p.waiting.values()] if invalid_at is None else []
    p.end()
    if invalid_at is not None:
        report.invalid += 1
        return invalid_at
    report.permutations += 1
    found = violations(db, scenario, p.ctx)
    if stuck:
        found.append(f"steps still waiting when every step had run: {', '.join(stuck)}")
    if found:
        report.violations.append((" ".join(p.log), found))
    return None


__all__ = ["COVER", "Cover", "Meeting", "MeetingCover", "Order", "Report", "Scenario", "Step",
           "count", "install", "interleavings", "meetings", "run"]

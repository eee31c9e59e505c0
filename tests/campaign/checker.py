"""The history checker: judges a finished schedule from committed data alone.

Times are the database's: a lease's grant and end (pgfence.leases), a write's commit
(``pg_xact_commit_timestamp`` of its row: the commit record's time, so commit order), the
database clock a write read at or before its fence (``fenced_not_before``). No client clock,
no client log: what a worker was told by complete() is in ``campaign.reports``, written in
complete's own transaction.

Each check is one query that returns a sentence per violation.
"""

from __future__ import annotations

from dataclasses import dataclass

from .database import Db


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


CHECKS: list[tuple[str, str]] = [
    # I1: never two current leases. A lease's term runs from its grant until it drained, ended
    # or expired (campaign.authority); a later generation granted inside it is a second owner.
    ("I1", """
select format('%s: generation %s granted at %s, inside the term of generation %s (ended %s)',
              b.resource, b.generation, b.acquired_at, a.generation, a.ended_at)
  from campaign.authority a
  join campaign.authority b
    on b.resource = a.resource and b.generation > a.generation and b.acquired_at < a.ended_at
"""),
    # I2: a fenced write commits before any later generation of its resource is granted...
    ("I2", """
select format('%s: write %s of generation %s committed at %s, '
              'after generation %s was granted at %s',
              w.resource, w.id, w.generation, w.committed_at, b.generation, b.acquired_at)
  from campaign.writes w
  cross join lateral (
    select b.generation, b.acquired_at from campaign.authority b
     where b.resource = w.resource and b.generation > w.generation
       and b.acquired_at < w.committed_at
     order by b.generation limit 1) b
"""),
    # ... and only if its lease was current when fence ran: fence ran no earlier than
    # fenced_not_before, so a write whose fenced_not_before is past its lease's term was let
    # through by an expired, drained or ended lease.
    ("I2", """
select format('%s: write %s of generation %s fenced at or after %s, when its term had ended (%s)',
              w.resource, w.id, w.generation, w.fenced_not_before, a.ended_at)
  from campaign.writes w
  join campaign.authority a on a.kind = 'pgfence' and a.lease_id = w.lease_id
 where w.fenced_not_before >= a.ended_at
"""),
    ("I2", """
select format('%s: write %s stamped generation %s, but its lease is %s',
              w.resource, w.id, w.generation, coalesce(l.resource || ' generation ' || l.generation,
                                                       'unknown'))
  from campaign.writes w
  left join pgfence.leases l on l.lease_id = w.lease_id
 where w.lease_id is not null
   and (l.lease_id is null or l.generation <> w.generation or l.resource <> w.resource)
"""),
    # I5: finished by the attempt that held it, exactly once, its result not lost.
    ("I5", """
select format('task %s completed with the result of attempt %s, but attempt %s held it',
              task_id, result->>'attempt', attempt)
  from pgfence.tasks
 where state = 'completed' and (result->>'attempt')::int is distinct from attempt
"""),
    ("I5", """
select format('task %s completed by attempt %s, which has no protected write', task_id, attempt)
  from pgfence.tasks t
 where state = 'completed'
   and not exists (select from campaign.writes w
                    where w.task_id = t.task_id and w.attempt = t.attempt)
"""),
    ("I5", """
select format('task %s: %s results accepted', t.task_id, count(r.*))
  from pgfence.tasks t
  left join campaign.reports r on r.task_id = t.task_id and r.outcome = 'accepted'
 where t.state = 'completed'
 group by t.task_id
having count(r.*) <> 1
"""),
    ("I5", """
select format('task %s: the result of attempt %s was accepted, but attempt %s held the task',
              r.task_id, r.attempt, t.attempt)
  from campaign.reports r
  join pgfence.tasks t on t.task_id = r.task_id
 where r.outcome = 'accepted' and r.attempt <> t.attempt
"""),
    ("I5", """
select format('task %s: attempt %s was told stale, but pgfence.stale_results has no record',
              r.task_id, r.attempt)
  from campaign.reports r
 where r.outcome = 'stale'
   and not exists (select from pgfence.stale_results s
                    where s.task_id = r.task_id and s.attempt = r.attempt)
"""),
    ("I5", """
select format('task %s: a result of attempt %s is recorded stale, but that attempt holds it',
              s.task_id, s.attempt)
  from pgfence.stale_results s
  join pgfence.tasks t on t.task_id = s.task_id
 where s.attempt >= t.attempt
"""),
    # Progress: every task completed within the bound after the last fault (or after it was
    # enqueued, if later). The only query with a parameter: its % are doubled.
    ("progress", """
select format('task %%s %%s (attempt %%s), enqueued %%s, last fault healed %%s',
              t.task_id, case when t.state = 'completed' then 'completed at ' || t.finished_at
                              else 'still ' || t.state end,
              t.attempt, t.enqueued_at, f.last)
  from pgfence.tasks t,
       (select coalesce(max(healed_at), '-infinity') as last from campaign.faults) f
 where t.state <> 'completed'
    or t.finished_at > greatest(t.enqueued_at, f.last) + make_interval(secs => %(bound)s)
"""),
]

FIGURES = """
select (select count(*) from pgfence.tasks),
       (select count(*) from campaign.writes),
       (select count(*) from campaign.authority),
       (select coalesce(sum(attempt), 0) from pgfence.tasks),
       (select count(*) from pgfence.stale_results),
       (select count(*) from campaign.writes where committed_at is null)
"""


def check(db: Db, bound: float) -> tuple[list[Violation], dict[str, int]]:
    tasks, writes, leases, claims, stale, untimed = db.sql(FIGURES)[0]
    if untimed:
        # Without commit times the I2 checks would pass vacuously: refuse to judge.
        raise RuntimeError(f"{untimed} writes have no commit timestamp "
                           "(is track_commit_timestamp on?)")
    violations = [Violation(invariant, detail)
                  for invariant, query in CHECKS
                  for (detail,) in db.sql(query, {"bound": bound} if "%(" in query else None)]
    figures = {"tasks": tasks, "writes": writes, "leases": leases, "claims": claims,
               "stale results": stale}
    return violations, {k: int(v) for k, v in figures.items()}

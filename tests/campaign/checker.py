"""The history checker: judges a finished schedule from committed data alone.

I1, I2 and I5 are testkit.invariants' checks, the same that judge every interleaving of
testkit.permutations, over the views below of the campaign's records. Times are the
database's: a lease's grant and end (pgfence.leases, or the advisory control's rows), a write's
commit (``pg_xact_commit_timestamp`` of its row: the commit record's time, so commit order), the
database clock a write read at or before its fence (``fenced_not_before``). No client clock,
no client log: what a worker was told by complete() is in ``campaign.reports``, written in
complete's own transaction.

Two checks are the campaign's own: every completed task has its handler's protected write (its
workload writes before it completes), and progress. Every task is named as
tests/campaign/database.py's views name it, whatever worked it: pgfence's tasks, the pgmq layer's
messages, pgflow's step tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

from testkit import invariants

from .database import Db


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


# The views of the history (tests/campaign/database.py, HISTORY and VIEWS) the shared checks
# read; requeues where pgflow is worked.
RECORDED = ("leases", "work", "results", "holders", "stale", "runs")

OWN_CHECKS: list[tuple[str, str]] = [
    # I5: the attempt that completed a task ran its handler: no accepted result lost.
    ("I5", """
select format('task %s completed by attempt %s, which has no protected write',
              t.task_id, t.attempt)
  from campaign.tasks t
 where t.state = 'completed'
   and not exists (select from campaign.runs w
                    where w.task_id = t.task_id and w.attempt = t.attempt)
"""),
    # Progress: every task completed within the bound after the last fault (or after it was
    # enqueued, if later). The only query with a parameter: its % are doubled.
    ("progress", """
select format('task %%s %%s (attempt %%s), enqueued %%s, last fault healed %%s',
              t.task_id, case when t.state = 'completed' then 'completed at ' || t.finished_at
                              else 'still ' || t.state end,
              t.attempt, t.enqueued_at, f.last)
  from campaign.tasks t,
       (select coalesce(max(healed_at), '-infinity') as last from campaign.faults) f
 where t.state <> 'completed'
    or t.finished_at > greatest(t.enqueued_at, f.last) + make_interval(secs => %(bound)s)
"""),
]

FIGURES = """
select (select count(*) from campaign.tasks),
       (select count(*) from campaign.writes),
       (select count(*) from campaign.authority),
       (select coalesce(sum(attempt), 0) from campaign.tasks),
       (select count(*) from campaign.stale),
       (select count(*) from campaign.writes where committed_at is null),
       to_regclass('campaign.requeues') is not null
"""


def check(db: Db, bound: float) -> tuple[list[Violation], dict[str, int]]:
    tasks, writes, leases, claims, stale, untimed, requeues = db.sql(FIGURES)[0]
    if untimed:
        # Without commit times the I2 checks would pass vacuously: refuse to judge.
        raise RuntimeError(f"{untimed} writes have no commit timestamp "
                           "(is track_commit_timestamp on?)")
    recorded = RECORDED + (("requeues",) if requeues else ())
    violations = [Violation(invariant, detail) for invariant, detail
                  in invariants.judge(db.sql, "campaign", recorded)]
    violations += [Violation(invariant, detail)
                   for invariant, query in OWN_CHECKS
                   for (detail,) in db.sql(query, {"bound": bound} if "%(" in query else None)]
    figures = {"tasks": tasks, "writes": writes, "leases": leases, "claims": claims,
               "stale results": stale}
    return violations, {k: int(v) for k, v in figures.items()}

"""The one invariant checker: judges a committed history from the database's own records.

Every interleaving of a scenario (testkit.permutations) and every schedule of the fault
campaign (tests/campaign) records its history its own way; each puts the same views over its
records in a schema of its own, and the checks here read only those views and pgfence's tables.
No client clock and no client log: times are the database's (commit order is
``pg_xact_commit_timestamp``, so ``track_commit_timestamp`` must be on).

    leases(resource, generation, lease_id, acquired_at, term_end, ended)
        each lease's term: from its grant to its drain, end or expiry (term_end); ended is its
        drain or end (null while neither happened)
    work(what, resource, generation, lease_id, not_before, committed_at)
        fenced writes and claims, each recorded in the transaction of the work it stands for:
        what it was ('write', 'claim', 'write 17'), the resource and generation it carries,
        its lease, a database time no later than its fence or claim, and its commit
    results(attempt_id, task_id, attempt, kind, outcome, committed_at)
        what complete, fail or extend told a worker, recorded in the same transaction
    holders(task_id, attempt, state, result_by, holders_result)
        each task: whose result it holds (result_by) and whether that is its own attempt's
    claims(task_id, attempt, committed_at)
        each claim of an attempt
    requeues(task_id, at, by, visible_until)
        each requeue of a claimed task by a session (not by a test's clock), and until when
        its attempt held it (a layer's: each start of a task again, as a pgflow takeover)
    stale(attempt_id, task_id, attempt)
        each result refused and recorded as stale (pgfence.stale_results, a layer's own)
    runs(task_id, attempt)
        each run of a handler, recorded by the handler in its fenced transaction

A task is named by task_id: pgfence's task id, or whatever names a layer's unit of work (a pgmq
message, a pgflow step task); attempt is its attempt's number (a claim's, a read count, pgflow's
attempts_count).

A recorder says which views it has; a check runs where every view it reads is recorded. Each
check is one query that returns a sentence per violation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

VIEWS = frozenset({"leases", "work", "results", "holders", "claims", "requeues", "stale",
                   "runs"})


@dataclass(frozen=True)
class Check:
    invariant: str
    reads: frozenset[str]
    sql: str                 # {h} is the recorder's schema


def _check(invariant: str, reads: str, sql: str) -> Check:
    return Check(invariant, frozenset(reads.split()), sql.strip())


CHECKS = (
    # I1: never two current leases: a later generation granted inside a lease's term.
    _check("I1", "leases", """
select format('%s: generation %s granted at %s, inside the term of generation %s (to %s)',
              b.resource, b.generation, b.acquired_at, a.generation, a.term_end)
  from {h}.leases a
  join {h}.leases b on b.resource = a.resource and b.generation > a.generation
 where b.acquired_at < a.term_end
"""),
    # I2: fenced work commits before any later generation of its resource is granted ...
    _check("I2", "work leases", """
select format('%s: %s of generation %s committed at %s, after generation %s was granted at %s',
              w.resource, w.what, w.generation, w.committed_at, b.generation, b.acquired_at)
  from {h}.work w
  cross join lateral (
    select b.generation, b.acquired_at from {h}.leases b
     where b.resource = w.resource and b.generation > w.generation
       and b.acquired_at < w.committed_at
     order by b.generation limit 1) b
"""),
    # ... and only if its lease was current when fence or claim ran: work that began at or
    # after its lease's term ended was let through by an expired, drained or ended lease ...
    _check("I2", "work leases", """
select format('%s of generation %s began at %s, after its term ended at %s',
              w.what, w.generation, w.not_before, l.term_end)
  from {h}.work w join {h}.leases l on l.lease_id = w.lease_id
 where w.not_before >= l.term_end
"""),
    # ... and before its lease was drained or released (those wait for it) ...
    _check("I2", "work leases", """
select format('%s of generation %s committed at %s, after its lease was drained or ended at %s',
              w.what, w.generation, w.committed_at, l.ended)
  from {h}.work w join {h}.leases l on l.lease_id = w.lease_id
 where w.committed_at > l.ended
"""),
    # ... and carries its lease's generation (the lease id is what is checked).
    _check("I2", "work", """
select format('a %s stamped generation %s under the lease of %s', w.what, w.generation,
              coalesce(l.resource || ' generation ' || l.generation, 'no lease'))
  from {h}.work w left join pgfence.leases l on l.lease_id = w.lease_id
 where w.lease_id is not null
   and (l.lease_id is null or l.generation <> w.generation or l.resource <> w.resource)
"""),
    # I5: no result of an attempt accepted (and no extend granted) after a later attempt of
    # its task was claimed ...
    _check("I5", "results claims", """
select format('%s of attempt %s of task %s accepted (committed %s) '
              'after attempt %s was claimed (committed %s)',
              r.kind, r.attempt, r.task_id, r.committed_at, c.attempt, c.committed_at)
  from {h}.results r
  join {h}.claims c on c.task_id = r.task_id and c.attempt > r.attempt
 where (r.outcome = 'accepted' or (r.kind = 'extend' and r.outcome is not null))
   and c.committed_at < r.committed_at
"""),
    # ... a completed task holds the result of the attempt that held it ...
    _check("I5", "holders", """
select format('task %s completed with the result of %s, not of its attempt %s',
              t.task_id, t.result_by, t.attempt)
  from {h}.holders t
 where t.state = 'completed' and not coalesce(t.holders_result, false)
"""),
    # ... an accepted result is kept, and only the attempt holding the task has one ...
    _check("I5", "results holders", """
select format('the accepted result of attempt %s of task %s is lost (the task is %s, '
              'attempt %s)', r.attempt, r.task_id, t.state, t.attempt)
  from {h}.results r join {h}.holders t on t.task_id = r.task_id
 where r.kind = 'complete' and r.outcome = 'accepted'
   and not (t.state = 'completed' and t.attempt = r.attempt and t.holders_result)
"""),
    # ... exactly once: a completed task was told accepted once ...
    _check("I5", "results holders", """
select format('task %s: %s results accepted', t.task_id, count(r.*))
  from {h}.holders t
  left join {h}.results r on r.task_id = t.task_id and r.kind = 'complete'
                          and r.outcome = 'accepted'
 where t.state = 'completed'
 group by t.task_id
having count(r.*) <> 1
"""),
    # ... a stale answer is recorded, and nothing recorded stale holds its task ...
    _check("I5", "results stale", """
select format('%s of %s was told stale but is not in stale_results', r.kind,
              case when r.task_id is null then r.attempt_id::text
                   else format('attempt %s of task %s', r.attempt, r.task_id) end)
  from {h}.results r
 where r.outcome = 'stale'
   and not exists (select from {h}.stale s
                    where s.attempt_id = r.attempt_id
                       or (s.task_id = r.task_id and s.attempt = r.attempt))
"""),
    _check("I5", "stale holders", """
select format('task %s: a result of attempt %s is recorded stale, but that attempt holds it',
              s.task_id, s.attempt)
  from {h}.stale s join {h}.holders t on t.task_id = s.task_id
 where s.attempt >= t.attempt
"""),
    # ... an attempt's handler runs once (only a new attempt runs a task again) ...
    _check("I5", "runs", """
select format('task %s: the handler of attempt %s ran %s times', r.task_id, r.attempt, count(*))
  from {h}.runs r
 group by r.task_id, r.attempt
having count(*) > 1
"""),
    # ... and no task is requeued while its attempt's visibility lasts.
    _check("I5", "requeues", """
select format('task %s requeued at %s by %s while its attempt held it until %s',
              q.task_id, q.at, q.by, q.visible_until)
  from {h}.requeues q
 where q.visible_until > q.at
"""),
)


def query(schema: str, recorded: Collection[str]) -> str:
    """Every check the recorded views allow, as one query of (invariant, sentence) rows."""
    unknown = set(recorded) - VIEWS
    if unknown:
        raise ValueError(f"unknown history views: {', '.join(sorted(unknown))}")
    parts = [f"(select '{c.invariant}'::text, x.s from ({c.sql.format(h=schema)}) as x(s))"
             for c in CHECKS if c.reads <= set(recorded)]
    return "\nunion all\n".join(parts)


def judge(sql: Callable[[str], list[tuple[Any, ...]]], schema: str,
          recorded: Collection[str]) -> list[tuple[str, str]]:
    """(invariant, sentence) of each violation in the history of ``schema``'s views; ``sql``
    runs a query and returns its rows."""
    return [(str(i), str(s)) for i, s in sql(query(schema, recorded))]

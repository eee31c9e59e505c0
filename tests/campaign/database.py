"""The campaign's tables in a schedule's database, and the supervisor's own connection."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from pgfence.connection import connect
from testkit.harness import Params, Query

SCHEMA = """
create schema campaign;

-- What complete() (or the pgmq layer's archive, the pgflow layer's complete_task) answered,
-- written in its own transaction: the database's record of every result it accepted, called
-- duplicate or refused as stale. pgfence's tasks are named by task id and attempt, a layer's
-- by its attempt id (the layer's record of the attempt says which message or step task).
create table campaign.reports (
  task_id    bigint,
  attempt    int,
  attempt_id uuid,
  kind       text not null default 'complete',
  outcome    text not null,
  worker     text not null,
  at         timestamptz not null default clock_timestamp(),
  check (task_id is not null and attempt is not null or attempt_id is not null)
);

-- Faults as the supervisor applied them, on the database's clock (the progress bound starts
-- at the last healed_at).
create table campaign.faults (
  id         int generated always as identity primary key,
  kind       text not null,
  target     text not null,
  started_at timestamptz not null,
  healed_at  timestamptz not null default clock_timestamp()
);

-- The advisory-lock negative control's "leases": a row each time a worker got the lock.
create sequence campaign.advisory_generation;
create table campaign.advisory_leases (
  resource    text not null,
  generation  bigint not null default nextval('campaign.advisory_generation'),
  owner       text not null,
  acquired_at timestamptz not null default clock_timestamp()
);
"""

# One protected table per resource (protect() names one resource per table): a row per
# handler run, written by the handler in its fenced transaction.
WRITES = """
create table campaign.{table} (
  id                bigint generated always as identity primary key,
  resource          text not null default {resource} check (resource = {resource}),
  lease_id          uuid,                  -- null only in the advisory control
  generation        bigint not null,
  task_id           bigint,                -- pgfence's task, or the pgmq message
  attempt           int,
  attempt_id        uuid,                  -- the attempt (a pgflow step task's only name)
  worker            text not null,
  fenced_not_before timestamptz not null   -- the database's clock at or before the fence ran
)
"""

# Every lease's term of authority: from its grant until it drained, ended or expired, whichever
# came first (expiry is final: an expired lease is never renewed). The advisory control's
# "leases" record no end: their holders acted as owners until their last write.
AUTHORITY = """
create view campaign.authority as
  select 'pgfence' as kind, l.resource, l.generation, l.lease_id, l.owner, l.acquired_at,
         least(l.drained_at, l.ended_at, l.expires_at) as ended_at
    from pgfence.leases l
  union all
  select 'advisory', a.resource, a.generation, null, a.owner, a.acquired_at,
         coalesce((select max(w.committed_at) from campaign.writes w
                    where w.resource = a.resource and w.generation = a.generation),
                  a.acquired_at)
    from campaign.advisory_leases a
"""

# The work, whatever works it, each piece by one name (task_id, text) and attempt number: the
# core's tasks by their id and claim count; the pgmq layer's messages ('message N') by their
# read count; pgflow's step tasks ('run R step S') by pgflow's attempts_count. Each view is a
# union of what the fleet's workers work (WORK below).
#   tasks     every task: its state, when it was enqueued and finished, and whose result it
#             holds (result_by; holders_result: the attempt's that holds it)
#   attempts  every attempt known: its lease, whether it is still open, since when
#   runs      every handler run: the protected write each one makes
#   results   what each result was told (campaign.reports; pgflow's: the layer's own record)
#   stale     the results each layer refused and recorded as stale
VIEWS = ("tasks", "attempts", "runs", "results", "stale")

WORK = {
    "core": {
        "tasks": """
  select t.task_id::text, t.attempt, t.state, t.enqueued_at, t.finished_at,
         t.result->>'attempt', (t.result->>'attempt')::int = t.attempt
    from pgfence.tasks t""",
        "attempts": """
  select t.task_id::text, t.attempt, t.lease_id, t.state = 'claimed', t.visible_until
    from pgfence.tasks t where t.attempt > 0""",
        "runs": """
  select w.task_id::text, w.attempt, w.id
    from campaign.writes w where w.resource = any ({resources})""",
        "results": """
  select null::uuid, r.task_id::text, r.attempt, r.kind, r.outcome,
         pg_xact_commit_timestamp(r.xmin)
    from campaign.reports r where r.attempt_id is null""",
        "stale": """
  select s.attempt_id, s.task_id::text, s.attempt from pgfence.stale_results s""",
    },
    # A message is archived once, by the read that still holds it: the archive table's row
    # keeps that read count, and the layer's record names the read whose archive it accepted.
    "pgmq": {
        "tasks": """
  select 'message ' || m.msg_id, m.read_ct, 'queued', m.enqueued_at, null::timestamptz,
         null::text, null::boolean
    from pgmq.{queue_table} m
  union all
  select 'message ' || a.msg_id, a.read_ct, 'completed', a.enqueued_at, a.archived_at,
         string_agg(p.read_ct::text, ', ' order by p.read_ct),
         count(p.*) = 1 and bool_and(p.read_ct = a.read_ct)
    from pgmq.{archive_table} a
    left join pgfence_pgmq.attempts p
      on p.queue = {queue} and p.msg_id = a.msg_id and p.outcome = 'archive'
   group by a.msg_id, a.read_ct, a.enqueued_at, a.archived_at""",
        "attempts": """
  select 'message ' || p.msg_id, p.read_ct, p.lease_id, p.outcome is null, p.read_at
    from pgfence_pgmq.attempts p where p.queue = {queue}""",
        "runs": """
  select 'message ' || p.msg_id, p.read_ct, w.id
    from campaign.writes w join pgfence_pgmq.attempts p on p.attempt_id = w.attempt_id
   where w.resource = any ({resources})""",
        "results": """
  select r.attempt_id, 'message ' || p.msg_id, p.read_ct, r.kind, r.outcome,
         pg_xact_commit_timestamp(r.xmin)
    from campaign.reports r join pgfence_pgmq.attempts p on p.attempt_id = r.attempt_id""",
        "stale": """
  select s.attempt_id, 'message ' || p.msg_id, p.read_ct
    from pgfence_pgmq.stale_results s join pgfence_pgmq.attempts p using (attempt_id)
   where p.queue = {queue}""",
    },
    # A step task's output is its handler's {"write": id}: the attempt whose write it is is the
    # attempt whose result pgflow kept.
    "pgflow": {
        "tasks": """
  select format('run %s step %s', st.run_id, st.step_slug), st.attempts_count, st.status,
         st.queued_at, coalesce(st.completed_at, st.failed_at),
         a.attempts_count::text, a.attempts_count = st.attempts_count
    from pgflow.step_tasks st
    left join campaign.writes w
      on w.resource = any ({resources}) and w.id = (st.output->>'write')::bigint
    left join pgfence_pgflow.attempts a on a.attempt_id = w.attempt_id
   where st.flow_slug = {flow}""",
        "attempts": """
  select format('run %s step %s', a.run_id, a.step_slug), a.attempts_count, a.lease_id,
         a.outcome is null, a.started_at
    from pgfence_pgflow.attempts a where a.flow_slug = {flow}""",
        "runs": """
  select format('run %s step %s', a.run_id, a.step_slug), a.attempts_count, w.id
    from campaign.writes w join pgfence_pgflow.attempts a on a.attempt_id = w.attempt_id
   where w.resource = any ({resources})""",
        # FlowWorker.serve reports by itself (no statement of the campaign's): what the layer
        # answered is its own record, written by the call that answered: an accepted result
        # is its attempt's outcome, a stale one a row of its stale_results (a duplicate,
        # nothing).
        "results": """
  select a.attempt_id, format('run %s step %s', a.run_id, a.step_slug), a.attempts_count,
         a.outcome, 'accepted', pg_xact_commit_timestamp(a.xmin)
    from pgfence_pgflow.attempts a where a.flow_slug = {flow} and a.outcome is not null
  union all
  select s.attempt_id, format('run %s step %s', a.run_id, a.step_slug), a.attempts_count,
         s.kind, 'stale', pg_xact_commit_timestamp(s.xmin)
    from pgfence_pgflow.stale_results s join pgfence_pgflow.attempts a using (attempt_id)
   where a.flow_slug = {flow}""",
        "stale": """
  select s.attempt_id, format('run %s step %s', a.run_id, a.step_slug), a.attempts_count
    from pgfence_pgflow.stale_results s join pgfence_pgflow.attempts a using (attempt_id)
   where a.flow_slug = {flow}""",
    },
}
COLUMNS = {
    "tasks": "task_id, attempt, state, enqueued_at, finished_at, result_by, holders_result",
    "attempts": "task_id, attempt, lease_id, open, since",
    "runs": "task_id, attempt, write_id",
    "results": "attempt_id, task_id, attempt, kind, outcome, committed_at",
    "stale": "attempt_id, task_id, attempt",
}

# The history as testkit.invariants reads it (tests/campaign/checker.py). A lease's term runs
# from its grant until it drained, ended or expired (campaign.authority, which holds the
# advisory control's too).
HISTORY = """
create view campaign.leases as
  select a.resource, a.generation, a.lease_id, a.acquired_at, a.ended_at as term_end,
         least(l.drained_at, l.ended_at) as ended
    from campaign.authority a left join pgfence.leases l on l.lease_id = a.lease_id;
create view campaign.work as
  select 'write ' || w.id as what, w.resource, w.generation, w.lease_id,
         w.fenced_not_before as not_before, w.committed_at
    from campaign.writes w;
create view campaign.holders as
  select task_id, attempt, state, result_by, holders_result from campaign.tasks;
"""

# pgflow: a task is started again only once its attempt can no longer hold it: its start (the
# read of its message) hid the message for the step's timeout + 2 s (the pgflow layer's rule;
# an extension only adds to it), unless the attempt failed and pgflow retried the task.
REQUEUES = """
create view campaign.requeues as
  select format('run %s step %s', b.run_id, b.step_slug) as task_id, b.started_at as at,
         l.owner as by,
         case when a.outcome = 'fail' then least(a.finished_at, v.until) else v.until end
           as visible_until
    from pgfence_pgflow.attempts a
    join pgfence_pgflow.attempts b
      on b.run_id = a.run_id and b.step_slug = a.step_slug and b.task_index = a.task_index
     and b.attempts_count = a.attempts_count + 1
    join pgfence.leases l on l.lease_id = b.lease_id
    cross join lateral (
      select r.read_at + make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 2)
        from pgfence_pgmq.attempts r, pgflow.steps s join pgflow.flows f using (flow_slug)
       where r.attempt_id = a.pgmq_attempt_id
         and s.flow_slug = a.flow_slug and s.step_slug = a.step_slug) v(until)
   where a.flow_slug = {flow}
"""


def install(conn: psycopg.Connection[Any], resources: dict[str, str], protect: bool,
            queue: str, flow: str) -> None:
    """The campaign's tables and views for ``resources`` (each resource and what its workers
    work: "core", "pgmq" or "pgflow"), their writes protected for their resources, or not."""
    conn.execute(SCHEMA)
    for r in resources:
        table = sql.Identifier(f"writes_{r}")
        conn.execute(sql.SQL(WRITES).format(table=table, resource=sql.Literal(r)))
        conn.execute("select pgfence.register(%s)", (r,))
        if protect:
            conn.execute("select pgfence.protect(%s::regclass, %s)", (f"campaign.writes_{r}", r))
    # Commit time from the commit record (track_commit_timestamp): the database's commit order.
    conn.execute(sql.SQL("create view campaign.writes as {}").format(sql.SQL(" union all ").join(
        sql.SQL("select w.*, pg_xact_commit_timestamp(w.xmin) as committed_at from {} w").format(
            sql.Identifier("campaign", f"writes_{r}")) for r in resources)))
    conn.execute(AUTHORITY)
    names = {"queue": sql.Literal(queue), "flow": sql.Literal(flow),
             "queue_table": sql.Identifier(f"q_{queue}"),
             "archive_table": sql.Identifier(f"a_{queue}")}
    # Each view: the core's part (its tables are empty where no worker works them) and the
    # part of each layer worked.
    worked = {work: [r for r, w in resources.items() if w == work]
              for work in ("core", "pgmq", "pgflow")}
    for view in VIEWS:
        selects = [sql.SQL(WORK[work][view]).format(resources=sql.Literal(rs), **names)
                   for work, rs in worked.items() if rs or work == "core"]
        conn.execute(sql.SQL("create view {} ({}) as {}").format(
            sql.Identifier("campaign", view), sql.SQL(COLUMNS[view]),
            sql.SQL("\n  union all").join(selects)))
    conn.execute(HISTORY)
    if worked["pgflow"]:
        conn.execute(sql.SQL(REQUEUES).format(**names))


class Db:
    """A connection of the supervisor's that outlives restarts and terminated backends: an
    operational error reconnects and runs the statement again. Only for statements that are
    safe to repeat (a repeated enqueue adds a task; the checker counts what is there)."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def sql(self, query: Query, params: Params = None,
            retry_for: float = 60.0) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = connect(self.dsn, self.name, timeout=5)
                with self._conn.cursor() as cur:
                    cur.execute(query, params)
                    return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)              # the server is restarting

    def one(self, query: Query, params: Params = None) -> Any:
        rows = self.sql(query, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

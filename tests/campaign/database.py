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

-- What complete() answered, written in complete's own transaction: the database's record of
-- every result it accepted, called duplicate or refused as stale.
create table campaign.reports (
  task_id bigint not null,
  attempt int not null,
  outcome text not null,
  worker  text not null,
  at      timestamptz not null default clock_timestamp()
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

# One protected table per resource (protect() names one resource per table).
WRITES = """
create table campaign.{table} (
  id                bigint generated always as identity primary key,
  resource          text not null default {resource} check (resource = {resource}),
  lease_id          uuid,                  -- null only in the advisory control
  generation        bigint not null,
  task_id           bigint,
  attempt           int,
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
create view campaign.results as
  select null::uuid as attempt_id, r.task_id, r.attempt, 'complete'::text as kind,
         r.outcome, pg_xact_commit_timestamp(r.xmin) as committed_at
    from campaign.reports r;
create view campaign.holders as
  select t.task_id, t.attempt, t.state, t.result->>'attempt' as result_by,
         (t.result->>'attempt')::int = t.attempt as holders_result
    from pgfence.tasks t;
"""


def install(conn: psycopg.Connection[Any], resources: tuple[str, ...], protect: bool) -> None:
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
    conn.execute(HISTORY)


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

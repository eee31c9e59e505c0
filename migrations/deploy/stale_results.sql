-- Deploy pgfence:stale_results
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Results that arrived from an attempt that no longer holds its task (I5): kept for operators,
-- never applied, never silently dropped.
create table pgfence.stale_results (
  attempt_id  uuid primary key,
  task_id     bigint not null,
  attempt     int not null,
  kind        text not null check (kind in ('complete', 'fail')),
  body        jsonb,
  received_at timestamptz not null default clock_timestamp()
);
comment on table pgfence.stale_results is 'Results refused as stale: the attempt had been superseded by a newer claim.';

revoke all on table pgfence.stale_results from public;
grant select on table pgfence.stale_results to pgfence_monitor, pgfence_operator;

commit;

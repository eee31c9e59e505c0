-- Deploy pgfence_pgflow:pgflow_attempts
-- requires: pgflow_schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One row per pgflow task started through pgfence_pgflow.start_tasks: what its attempt id
-- stands for. attempts_count is pgflow's own count of the task's starts as this start left it:
-- the task is this attempt's while it is still started with that count (a newer start, a
-- takeover included, raises it). outcome keeps the accepted result, so that a retry is told
-- duplicate. Rows are kept, as the record of who started what.
create table pgfence_pgflow.attempts (
  attempt_id      uuid primary key,
  pgmq_attempt_id uuid not null,
  flow_slug       text not null,
  run_id          uuid not null,
  step_slug       text not null,
  task_index      int not null,
  msg_id          bigint not null,
  attempts_count  int not null,
  lease_id        uuid not null,
  started_at      timestamptz not null default clock_timestamp(),
  outcome         text check (outcome in ('complete', 'fail')),
  finished_at     timestamptz
);
comment on table pgfence_pgflow.attempts is
  'Starts of pgflow tasks under a lease (start_tasks), and the result each attempt had accepted. Not a public interface.';
create index attempts_task on pgfence_pgflow.attempts (run_id, step_slug, task_index);

-- Results refused because their attempt no longer held its task (I5): kept for operators,
-- never applied, never silently dropped. One row per attempt and kind.
create table pgfence_pgflow.stale_results (
  attempt_id  uuid not null references pgfence_pgflow.attempts,
  kind        text not null check (kind in ('complete', 'fail')),
  body        jsonb,
  received_at timestamptz not null default clock_timestamp(),
  primary key (attempt_id, kind)
);
comment on table pgfence_pgflow.stale_results is
  'Results of pgflow tasks refused as stale: the attempt had been superseded by a newer start (a takeover or a retry).';

revoke all on table pgfence_pgflow.attempts, pgfence_pgflow.stale_results from public;
grant select on table pgfence_pgflow.attempts, pgfence_pgflow.stale_results to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence_pgflow:pgflow_schema
--
-- pgfence's optional pgflow layer: pgflow's worker protocol (read, start_tasks, complete_task,
-- fail_task) under a lease on the worker function's resource. Schema pgfence_pgflow; installed
-- after pgfence, its pgmq layer and pgflow, never needed by any of them.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  if pg_catalog.to_regprocedure('pgfence.lockdown(name)') is null
     or pg_catalog.to_regclass('pgfence.layers') is null then
    raise exception 'pgfence pgflow layer: needs pgfence 0.2.0 or later installed first'
      using errcode = '55000', hint = 'install sql/pgfence.sql (or upgrade), then this file';
  end if;
  if pg_catalog.to_regprocedure('pgfence_pgmq.read(uuid, text, interval, int)') is null then
    raise exception 'pgfence pgflow layer: needs the pgmq layer installed first'
      using errcode = '55000', hint = 'install sql/pgfence-pgmq.sql, then this file';
  end if;
  -- pgflow 0.8: start_tasks by message ids and worker, step_tasks with attempts_count.
  if pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid)') is null
     or pg_catalog.to_regprocedure('pgflow.complete_task(uuid, text, int, jsonb)') is null
     or pg_catalog.to_regprocedure('pgflow.fail_task(uuid, text, int, text)') is null
     or not exists (select from pg_catalog.pg_attribute a
                     where a.attrelid operator(pg_catalog.=) pg_catalog.to_regclass('pgflow.step_tasks')
                       and a.attname operator(pg_catalog.=) 'attempts_count' and not a.attisdropped) then
    raise exception 'pgfence pgflow layer: needs pgflow 0.8 or later installed first'
      using errcode = '55000', hint = 'apply @pgflow/core''s migrations, then this file';
  end if;
end
$$;

create schema pgfence_pgflow;
comment on schema pgfence_pgflow is 'pgfence''s pgflow layer: pgflow''s worker protocol under pgfence leases.';
revoke all on schema pgfence_pgflow from public;
grant usage on schema pgfence_pgflow to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

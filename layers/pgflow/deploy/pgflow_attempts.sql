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

-- update_status counts the open attempts of a resource's leases.
create index attempts_open on pgfence_pgflow.attempts (lease_id) where outcome is null;

-- Results refused because their attempt no longer held its task (I5): kept for operators,
-- never applied, never silently dropped. Each different report of an attempt is kept (a retry
-- of one already kept adds nothing), numbered per attempt, at most 10, as pgfence.stale_results.
create table pgfence_pgflow.stale_results (
  attempt_id  uuid not null references pgfence_pgflow.attempts,
  report      int not null,
  kind        text not null check (kind in ('complete', 'fail')),
  body        jsonb,
  received_at timestamptz not null default clock_timestamp(),
  primary key (attempt_id, report)
);
comment on table pgfence_pgflow.stale_results is
  'Results of pgflow tasks refused as stale: the attempt had been superseded by a newer start (a takeover or a retry).';

-- What monitors and operators see of the starts: no attempt id or lease id (the holder's
-- capabilities), a reference to each instead (pgfence.capability_ref), which correlates rows
-- (stale_results' attempt_ref, pgfence_pgmq.reads' attempt_ref of the read).
create view pgfence_pgflow.starts as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.pgmq_attempt_id) as read_ref,
       pgfence.capability_ref(a.lease_id) as lease_ref, l.resource, a.flow_slug, a.run_id, a.step_slug,
       a.task_index, a.msg_id, a.attempts_count, a.started_at, a.outcome, a.finished_at
  from pgfence_pgflow.attempts a
  left join pgfence.leases l on l.lease_id = a.lease_id;
comment on view pgfence_pgflow.starts is
  'One row per pgflow task started through pgfence_pgflow.start_tasks: references to its attempt, read and lease, '
  'the task, and the result accepted, if any.';
create view pgfence_pgflow.stale as
select pgfence.capability_ref(s.attempt_id) as attempt_ref, s.report, s.kind, s.body, s.received_at,
       a.flow_slug, a.run_id, a.step_slug, a.task_index, a.attempts_count
  from pgfence_pgflow.stale_results s join pgfence_pgflow.attempts a on a.attempt_id = s.attempt_id;
comment on view pgfence_pgflow.stale is 'pgfence_pgflow.stale_results for monitors: each refused result, its task and attempt''s reference.';

-- The layer never widens pgflow's own grants: it acts for its caller (pgfence.invoker(): the
-- role set, else the session's user) only where that role could call pgflow's own function
-- (USAGE on schema pgflow, EXECUTE on the function) and write its tasks (UPDATE on
-- pgflow.step_tasks, which pgflow's functions, running as their caller, update).
create function pgfence_pgflow.check_allowed(fn regprocedure)
returns void
language plpgsql
stable
as $$
declare
  v_role name := pgfence.invoker();
begin
  if not (pg_catalog.has_schema_privilege(v_role, 'pgflow', 'usage')
          and pg_catalog.has_function_privilege(v_role, fn, 'execute')
          and pg_catalog.has_table_privilege(v_role, 'pgflow.step_tasks', 'select')
          and pg_catalog.has_table_privilege(v_role, 'pgflow.step_tasks', 'update')) then
    raise exception 'pgfence pgflow layer: role % may not call % with pgflow itself', v_role, fn
      using errcode = '42501',
            hint = 'grant the role what pgflow itself needs (docs/pgflow.md, "Grants"), or call as a role that has it';
  end if;
end
$$;
revoke all on function pgfence_pgflow.check_allowed(regprocedure) from public;

revoke all on table pgfence_pgflow.attempts, pgfence_pgflow.stale_results, pgfence_pgflow.starts,
                    pgfence_pgflow.stale from public;
grant select on table pgfence_pgflow.starts, pgfence_pgflow.stale to pgfence_monitor, pgfence_operator;

commit;

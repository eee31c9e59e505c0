-- Deploy pgfence_pgflow:pgflow_in_flight
-- requires: pgflow_attempts
--
-- Reworked in 0.3.0: the layer's judgement of its starts written once (open_starts: a start
-- without a result that can still be accepted), which in_flight, leases and prune ask;
-- in_flight answers per lease, without arguments (the core judges the leases:
-- pgfence.layer_work), and reads no pgfence table.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The starts without a result that can still be accepted (finish's rule): the task is still
-- started, with the attempts_count this start gave it. Its handler may still be working.
-- Anything else without a result was abandoned: its worker died and the task was taken over,
-- or finished by someone else.
create function pgfence_pgflow.open_starts()
returns table (attempt_id uuid, lease_id uuid)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select a.attempt_id, a.lease_id
    from pgfence_pgflow.attempts a
    join pgflow.step_tasks st
      on st.run_id = a.run_id and st.step_slug = a.step_slug and st.task_index = a.task_index
     and st.status = 'started' and st.attempts_count = a.attempts_count
   where a.outcome is null;
$$;
comment on function pgfence_pgflow.open_starts() is
  'The starts without a result that can still be accepted: their task is still started by them.';
revoke all on function pgfence_pgflow.open_starts() from public;

-- Update windows and lease_status count this layer's work (pgfence.layer_work, through
-- pgfence.layers): per lease, the pgflow tasks started under it and still started by that start.
-- (Over 0.2's: its result changes, so the old one is dropped; a fresh install has none.)
set local client_min_messages = warning;
-- (its result changes; the core calls it by its registration, which this change replaces)
-- squawk-ignore ban-drop-function
drop function if exists pgfence_pgflow.in_flight(text[]);
create function pgfence_pgflow.in_flight()
returns table (lease_id uuid, kind text, in_flight bigint)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select o.lease_id, 'pgflow'::text, count(*) from pgfence_pgflow.open_starts() o group by o.lease_id;
$$;
comment on function pgfence_pgflow.in_flight() is
  'pgfence.layers: per lease, the pgflow tasks started under it and still started by that start.';
revoke all on function pgfence_pgflow.in_flight() from public;

-- pgfence.prune keeps the leases of this layer's starts that can still be accepted: a late
-- result's writes into protected tables are shown its lease's resource (a lease pruned under
-- it would leave the guard nothing to see). An abandoned start keeps no lease.
create or replace function pgfence_pgflow.leases()
returns setof uuid
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select distinct o.lease_id from pgfence_pgflow.open_starts() o;
$$;
comment on function pgfence_pgflow.leases() is
  'pgfence.layers: the leases of this layer''s starts that can still be accepted (pgfence.prune keeps them).';
revoke all on function pgfence_pgflow.leases() from public;

-- Registered (a fresh install), or its hook replaced (over 0.2).
insert into pgfence.layers (schema_name, in_flight, leases)
values ('pgfence_pgflow', 'pgfence_pgflow.in_flight()', 'pgfence_pgflow.leases()')
on conflict (schema_name) do update set in_flight = excluded.in_flight, leases = excluded.leases;

commit;

-- Revert pgfence_pgflow:pgflow_in_flight: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Update windows count this layer's work (pgfence.update_status, through pgfence.layers):
-- per resource, the pgflow tasks started under one of its leases that have no result and are
-- still started by that start (the same attempts_count): a handler may still be working.
create function pgfence_pgflow.in_flight(resources text[])
returns table (resource text, kind text, in_flight bigint)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select l.resource, 'pgflow'::text, count(*)
    from pgfence.leases l
    join pgfence_pgflow.attempts a on a.lease_id = l.lease_id and a.outcome is null
    join pgflow.step_tasks st
      on st.run_id = a.run_id and st.step_slug = a.step_slug and st.task_index = a.task_index
     and st.status = 'started' and st.attempts_count = a.attempts_count
   where l.resource = any (in_flight.resources)
   group by l.resource;
$$;
comment on function pgfence_pgflow.in_flight(text[]) is
  'pgfence.layers: per resource, the pgflow tasks started under its leases and still started by that start.';
revoke all on function pgfence_pgflow.in_flight(text[]) from public;

-- pgfence.prune keeps the leases of this layer's starts without a result: a late result of one
-- may still be accepted, and its write into a protected queue table is shown its lease's
-- resource (a lease pruned under it would leave the guard nothing to see).
create or replace function pgfence_pgflow.leases()
returns setof uuid
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select distinct a.lease_id from pgfence_pgflow.attempts a where a.outcome is null;
$$;
comment on function pgfence_pgflow.leases() is
  'pgfence.layers: the leases of this layer''s starts without a result (pgfence.prune keeps them).';
revoke all on function pgfence_pgflow.leases() from public;

update pgfence.layers set in_flight = 'pgfence_pgflow.in_flight(text[])' where schema_name = 'pgfence_pgflow';
drop function pgfence_pgflow.in_flight();
drop function pgfence_pgflow.open_starts();

commit;

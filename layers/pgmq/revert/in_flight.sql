-- Revert pgfence_pgmq:in_flight: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create function pgfence_pgmq.in_flight(resources text[])
returns table (resource text, kind text, in_flight bigint)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_queue text;
begin
  for v_queue in
    select distinct a.queue
      from pgfence.leases l join pgfence_pgmq.attempts a on a.lease_id = l.lease_id and a.outcome is null
     where l.resource = any (in_flight.resources)
  loop
    if pg_catalog.to_regclass(format('pgmq.%I', pg_catalog.lower('q_' || v_queue))) is null then
      continue;  -- the queue was dropped: nothing of it is in flight
    end if;
    return query execute format(
      'select l.resource, ''pgmq''::text, count(*) '
      '  from pgfence.leases l join pgfence_pgmq.attempts a on a.lease_id = l.lease_id and a.outcome is null '
      '  join pgmq.%I m on m.msg_id = a.msg_id and m.read_ct = a.read_ct and m.enqueued_at = a.enqueued_at '
      ' where l.resource = any ($1) and a.queue = $2 and m.vt > clock_timestamp() '
      ' group by l.resource', pg_catalog.lower('q_' || v_queue))
      using in_flight.resources, v_queue;
  end loop;
end
$$;
comment on function pgfence_pgmq.in_flight(text[]) is
  'pgfence.layers: per resource, the pgmq messages read under its leases, without a result and still hidden.';
revoke all on function pgfence_pgmq.in_flight(text[]) from public;

create or replace function pgfence_pgmq.leases()
returns setof uuid
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select distinct a.lease_id from pgfence_pgmq.attempts a where a.outcome is null;
$$;
comment on function pgfence_pgmq.leases() is
  'pgfence.layers: the leases of this layer''s reads without a result (pgfence.prune keeps them).';

update pgfence.layers set in_flight = 'pgfence_pgmq.in_flight(text[])' where schema_name = 'pgfence_pgmq';
drop function pgfence_pgmq.in_flight();
drop function pgfence_pgmq.open_reads();

commit;

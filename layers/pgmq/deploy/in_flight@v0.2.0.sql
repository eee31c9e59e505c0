-- Deploy pgfence_pgmq:in_flight
-- requires: attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Update windows count this layer's work (pgfence.update_status, through pgfence.layers):
-- per resource, the messages read under one of its leases that have no result and are still
-- hidden, as read (the same read count, the same message): a handler may still be working on
-- them. A message visible again, or read again since, is no longer its reader's.
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

-- pgfence.prune keeps the leases of this layer's reads without a result: a late result of one
-- may still be accepted, and its write into a protected queue table is shown its lease's
-- resource (a lease pruned under it would leave the guard nothing to see).
create function pgfence_pgmq.leases()
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
revoke all on function pgfence_pgmq.leases() from public;

insert into pgfence.layers (schema_name, in_flight, leases)
values ('pgfence_pgmq', 'pgfence_pgmq.in_flight(text[])', 'pgfence_pgmq.leases()');

commit;

-- Deploy pgfence_pgmq:in_flight
-- requires: attempts
-- requires: attempts_order
--
-- Reworked in 0.3.0: the layer's judgement of its reads written once (open_reads: a read
-- without a result that can still be accepted), which in_flight, leases and prune ask; in_flight
-- answers per lease, without arguments (the core judges the leases: pgfence.layer_work).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The reads without a result that can still be accepted (finish's rule): their message is
-- still the one read, with the read count this read gave it, and the layer's record holds no
-- later read of it. hidden: the message is still hidden as read, so its handler may still be
-- working (a message visible again is no longer its reader's to keep, though a late result is
-- still accepted until someone reads it). Anything else without a result was abandoned: its
-- worker died, or it was taken over, or the queue is gone.
create function pgfence_pgmq.open_reads()
returns table (attempt_id uuid, lease_id uuid, hidden boolean)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_queue text;
begin
  for v_queue in select distinct a.queue from pgfence_pgmq.attempts a where a.outcome is null loop
    if pg_catalog.to_regclass(format('pgmq.%I', pg_catalog.lower('q_' || v_queue))) is null then
      continue;  -- the queue was dropped: nothing of it can be accepted
    end if;
    return query execute format(
      'select a.attempt_id, a.lease_id, m.vt > clock_timestamp() '
      '  from pgfence_pgmq.attempts a '
      '  join pgmq.%I m on m.msg_id = a.msg_id and m.read_ct = a.read_ct and m.enqueued_at = a.enqueued_at '
      ' where a.outcome is null and a.queue = $1 '
      '   and not exists (select from pgfence_pgmq.attempts b '
      '                    where b.queue = a.queue and b.msg_id = a.msg_id '
      '                      and coalesce(b.read_order, 0) > coalesce(a.read_order, 0))',
      pg_catalog.lower('q_' || v_queue))
      using v_queue;
  end loop;
end
$$;
comment on function pgfence_pgmq.open_reads() is
  'The reads without a result that can still be accepted, and whether their message is still hidden.';
revoke all on function pgfence_pgmq.open_reads() from public;

-- Update windows and lease_status count this layer's work (pgfence.layer_work, through
-- pgfence.layers): per lease, the messages read under it that have no result and are still
-- hidden as read: a handler may still be working on them.
-- (Over 0.2's: its result changes, so the old one is dropped; a fresh install has none.)
set local client_min_messages = warning;
-- (its result changes; the core calls it by its registration, which this change replaces)
-- squawk-ignore ban-drop-function
drop function if exists pgfence_pgmq.in_flight(text[]);
create function pgfence_pgmq.in_flight()
returns table (lease_id uuid, kind text, in_flight bigint)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select o.lease_id, 'pgmq'::text, count(*) from pgfence_pgmq.open_reads() o where o.hidden group by o.lease_id;
$$;
comment on function pgfence_pgmq.in_flight() is
  'pgfence.layers: per lease, the pgmq messages read under it, without a result and still hidden.';
revoke all on function pgfence_pgmq.in_flight() from public;

-- pgfence.prune keeps the leases of this layer's reads that can still be accepted: the write of
-- a late result into a protected queue table is shown its lease's resource (a lease pruned
-- under it would leave the guard nothing to see). An abandoned read keeps no lease.
create or replace function pgfence_pgmq.leases()
returns setof uuid
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select distinct o.lease_id from pgfence_pgmq.open_reads() o;
$$;
comment on function pgfence_pgmq.leases() is
  'pgfence.layers: the leases of this layer''s reads that can still be accepted (pgfence.prune keeps them).';
revoke all on function pgfence_pgmq.leases() from public;

-- Registered (a fresh install), or its hook replaced (over 0.2).
insert into pgfence.layers (schema_name, in_flight, leases)
values ('pgfence_pgmq', 'pgfence_pgmq.in_flight()', 'pgfence_pgmq.leases()')
on conflict (schema_name) do update set in_flight = excluded.in_flight, leases = excluded.leases;

commit;

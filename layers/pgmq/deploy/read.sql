-- Deploy pgfence_pgmq:read
-- requires: attempts
--
-- Reworked in 0.3.0: the lease held and the transaction marked by the core's
-- pgfence.hold_fenced, not by reading pgfence.leases and pgfence.signing_key here.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence_pgmq.read(lease_id uuid, queue text, vt interval, qty int default 1)
returns table (attempt_id uuid, msg_id bigint, read_ct int, enqueued_at timestamptz, message jsonb)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_not_null('lease_id', read.lease_id);
  perform pgfence_pgmq.check_allowed(pgfence_pgmq.queue_table(read.queue), 'update');
  perform pgfence.check_interval('vt', read.vt);
  if read.qty is null or read.qty not between 1 and 1000 then
    perform pgfence.invalid_argument('qty', 'must be 1 to 1000', read.qty::text);
  end if;
  -- What fence() does, in the transaction of the read (as claim; the core's hold_fenced): the
  -- lease row stays locked until this transaction ends, so no successor is granted between the
  -- check and the read (I2), and the transaction is marked fenced for the lease's resource, so
  -- the read's update passes the guard of a protected queue table (and so does the rest of the
  -- transaction).
  perform pgfence.hold_fenced(read.lease_id);
  -- pgmq's own read (visible messages in msg_id order, SKIP LOCKED so that readers never wait
  -- for each other; vt in whole seconds, as pgmq counts it, rounded up), each message
  -- recorded with its attempt id in the same statement.
  return query
  with did_read as (
    select r.msg_id, r.read_ct, r.enqueued_at, r.message
      from pgmq.read(read.queue, ceil(date_part('epoch', read.vt))::int, read.qty) r),
  attempts as (
    insert into pgfence_pgmq.attempts as a (attempt_id, queue, msg_id, read_ct, enqueued_at, lease_id)
    select pgfence_pgmq.attempt_uuid(d.msg_id, d.read_ct), read.queue, d.msg_id, d.read_ct, d.enqueued_at,
           read.lease_id
      from did_read d
    returning a.attempt_id, a.msg_id)
  select a.attempt_id, d.msg_id, d.read_ct, d.enqueued_at, d.message
    from did_read d join attempts a on a.msg_id = d.msg_id
   order by d.msg_id;
end
$$;
comment on function pgfence_pgmq.read(uuid, text, interval, int) is
  'Reads up to qty visible messages of a pgmq queue (pgmq.read) for vt, in whole seconds rounded up, only under the '
  'resource''s active, unexpired lease, checked and held to the end of the transaction (as claim), and only where the '
  'caller''s role may read the queue with pgmq itself. Raises PF001, 42501, 22023.';

revoke all on function pgfence_pgmq.read(uuid, text, interval, int) from public;
grant execute on function pgfence_pgmq.read(uuid, text, interval, int) to pgfence_worker;

commit;

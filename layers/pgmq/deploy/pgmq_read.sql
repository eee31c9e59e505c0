-- Deploy pgfence_pgmq:pgmq_read
-- requires: pgmq_attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create function pgfence.pgmq_read(lease_id uuid, queue text, vt interval, qty int default 1)
returns table (attempt_id uuid, msg_id bigint, read_ct int, enqueued_at timestamptz, message jsonb)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_table text;
  v_key bytea;
  v_lease pgfence.leases;
begin
  perform pgfence.check_not_null('lease_id', pgmq_read.lease_id);
  v_table := pgfence.pgmq_queue_table(pgmq_read.queue);
  perform pgfence.check_interval('vt', pgmq_read.vt);
  if pgmq_read.qty is null or pgmq_read.qty not between 1 and 1000 then
    perform pgfence.invalid_argument('qty', 'must be 1 to 1000', pgmq_read.qty::text);
  end if;
  select k.hmac_key into v_key from pgfence.signing_key k;
  -- What fence() does, in the transaction of the read (as claim): the lease row stays locked
  -- until this transaction ends, so no successor is granted between the check and the read
  -- (I2), and the transaction is marked fenced for the lease's resource, so the read's update
  -- passes the guard of a protected queue table (and so does the rest of the transaction).
  v_lease := pgfence.hold_current(pgmq_read.lease_id);
  perform pgfence.mark_fenced(v_lease.resource, v_key);
  -- pgmq.read's own selection (visible messages in msg_id order, SKIP LOCKED so readers never
  -- wait for each other), with the visibility as an interval, and each read recorded with its
  -- attempt id in the same statement.
  return query execute format(
    $q$
    with picked as (
      select m.msg_id from pgmq.%1$I m
       where m.vt <= clock_timestamp()
       order by m.msg_id
       limit $2
         for update skip locked),
    did_read as (
      update pgmq.%1$I m
         set last_read_at = clock_timestamp(), vt = clock_timestamp() + $3, read_ct = m.read_ct + 1
        from picked
       where m.msg_id = picked.msg_id
      returning m.msg_id, m.read_ct, m.enqueued_at, m.message),
    attempts as (
      insert into pgfence.pgmq_attempts (attempt_id, queue, msg_id, read_ct, lease_id)
      select pgfence.pgmq_attempt_uuid($4, r.msg_id, r.read_ct, $1, $5), $4, r.msg_id, r.read_ct, $1
        from did_read r
      returning pgmq_attempts.attempt_id, pgmq_attempts.msg_id)
    select a.attempt_id, r.msg_id, r.read_ct, r.enqueued_at, r.message
      from did_read r join attempts a on a.msg_id = r.msg_id
     order by r.msg_id
    $q$, v_table)
  using pgmq_read.lease_id, pgmq_read.qty, pgmq_read.vt, pgmq_read.queue, v_key;
end
$$;
comment on function pgfence.pgmq_read(uuid, text, interval, int) is
  'Reads up to qty visible messages of a pgmq queue for vt, only under the resource''s active, unexpired lease, '
  'checked and held to the end of the transaction (as claim). Raises PF001, 22023.';

revoke all on function pgfence.pgmq_read(uuid, text, interval, int) from public;
grant execute on function pgfence.pgmq_read(uuid, text, interval, int) to pgfence_worker;

commit;

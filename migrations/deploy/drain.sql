-- Deploy pgfence:drain
-- requires: limit_idle
-- requires: lease_judgement
-- requires: leases
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.drain(lease_id uuid)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_state text;
  v_expires_at timestamptz;
begin
  perform pgfence.check_not_null('lease_id', drain.lease_id);
  -- FOR UPDATE: the lease stays current until the owner's open fenced transactions end (I2),
  -- and a REPEATABLE READ or SERIALIZABLE fence whose snapshot predates this drain gets 40001
  -- rather than the row version its snapshot holds (FOR KEY SHARE conflicts with FOR UPDATE).
  select l.state, l.expires_at into v_state, v_expires_at
    from pgfence.leases l
   where l.lease_id = drain.lease_id
     for update;
  if not found or not pgfence.is_live(v_state, v_expires_at) then
    perform pgfence.lease_not_current(drain.lease_id);
  end if;
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
  if v_state = 'active' then
    update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
     where l.lease_id = drain.lease_id;
  end if;
  return 'draining';
end
$$;
comment on function pgfence.drain(uuid) is
  'The owner stops claiming; the resource is free for a successor at once. Idempotent. Raises PF001 for a lease that is not current.';

revoke all on function pgfence.drain(uuid) from public;
grant execute on function pgfence.drain(uuid) to pgfence_worker;

commit;

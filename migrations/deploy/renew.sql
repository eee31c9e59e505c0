-- Deploy pgfence:renew
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

create or replace function pgfence.renew(lease_id uuid, ttl interval, out expires_at timestamptz, out state text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_replaced timestamptz;
  v_updated_at timestamptz;
begin
  if not pgfence.interval_ok(renew.ttl) then
    perform pgfence.check_interval('ttl', renew.ttl);
  end if;
  -- One HOT update. Its lock (FOR NO KEY UPDATE) does not wait for the owner's fenced
  -- transactions (FOR KEY SHARE). Expiry is final: an expired lease never comes back, so a
  -- takeover that found it expired cannot be undone by a late renewal. The WHERE clause is
  -- evaluated before a lock wait, and again after it only if the row was updated meanwhile:
  -- behind a transaction that only locked the row (a repeated drain, an acquire that found
  -- the lease current) the update goes through unchecked, however long it waited. So the
  -- expiry it replaced is kept in renewed_from and judged against the clock read in
  -- RETURNING, which runs after the row is written, after any wait.
  -- A renewal never moves expires_at backwards: a REPEATABLE READ or SERIALIZABLE caller of
  -- fence or claim judges the row version its snapshot holds, which a renewal (not conflicting
  -- with their FOR KEY SHARE) does not make it re-read; so the expiry it sees must never be
  -- later than the real one.
  update pgfence.leases l
     set renewed_from = l.expires_at,
         expires_at = greatest(l.expires_at, clock_timestamp() + renew.ttl),
         renewed_at = clock_timestamp()
   where l.lease_id = renew.lease_id and pgfence.is_live(l.state, l.expires_at)
  returning l.renewed_from, clock_timestamp(), l.expires_at, l.state
       into v_replaced, v_updated_at, expires_at, state;
  if not found then
    -- (A NULL lease_id finds no lease: checked here, so that a renewal is spared the call.)
    perform pgfence.check_not_null('lease_id', renew.lease_id);
    perform pgfence.lease_not_current(renew.lease_id);
  elsif v_replaced <= v_updated_at then
    -- It expired while this renewal waited: the exception undoes the update.
    perform pgfence.lease_not_current(renew.lease_id, v_replaced);
  end if;
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
end
$$;
comment on function pgfence.renew(uuid, interval) is
  'Extends an active or draining, unexpired lease to ttl from now, never shortening it; idempotent. Raises PF001 otherwise.';

revoke all on function pgfence.renew(uuid, interval) from public;
grant execute on function pgfence.renew(uuid, interval) to pgfence_worker;

commit;

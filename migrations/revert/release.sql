-- Revert pgfence:release: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.release(lease_id uuid)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_state text;
begin
  perform pgfence.check_not_null('lease_id', release.lease_id);
  select l.state into v_state
    from pgfence.leases l
   where l.lease_id = release.lease_id
     for update;
  if not found then
    perform pgfence.lease_not_current(release.lease_id);
  end if;
  if v_state not in ('active', 'draining') then
    return false;
  end if;
  update pgfence.leases l
     set state = 'released', ended_at = clock_timestamp()
   where l.lease_id = release.lease_id;
  return true;
end
$$;
comment on function pgfence.release(uuid) is
  'Ends this lease: true if this call ended it, false if it had already ended. Never touches another lease. Raises PF001 for an unknown lease.';

revoke all on function pgfence.release(uuid) from public;
grant execute on function pgfence.release(uuid) to pgfence_worker;

commit;

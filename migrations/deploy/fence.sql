-- Deploy pgfence:fence
-- requires: leases

begin;

create function pgfence.fence(lease_id uuid)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_lease pgfence.leases;
  v_marker text;
begin
  perform pgfence.check_not_null('lease_id', fence.lease_id);
  -- FOR KEY SHARE, held to the end of the caller's transaction: a takeover, drain or release
  -- needs FOR UPDATE on this row and waits until then (I2). Concurrent fences of the same
  -- lease and renewals do not conflict with it.
  select * into v_lease
    from pgfence.leases l
   where l.lease_id = fence.lease_id
     for key share;
  -- Judged after the lock wait, on the clock of this moment (I7).
  if not found or v_lease.state <> 'active' or v_lease.expires_at <= clock_timestamp() then
    perform pgfence.lease_not_current(fence.lease_id);
  end if;
  -- A transaction-local marker for the guard of protected tables: it lives exactly as long
  -- as the row lock above (both end at commit, rollback or rollback to an earlier savepoint).
  v_marker := coalesce(nullif(current_setting('pgfence.fenced', true), ''), E'\n');
  if strpos(v_marker, E'\n' || v_lease.resource || E'\n') = 0 then
    perform set_config('pgfence.fenced', v_marker || v_lease.resource || E'\n', true);
  end if;
  return v_lease.generation;
end
$$;
comment on function pgfence.fence(uuid) is
  'Call inside the transaction it protects: returns the generation if the lease is the resource''s active, '
  'unexpired lease, and keeps it so until the transaction ends. Raises PF001 otherwise.';

revoke all on function pgfence.fence(uuid) from public;
grant execute on function pgfence.fence(uuid) to pgfence_worker;

commit;

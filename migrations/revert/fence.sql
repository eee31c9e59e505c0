-- Revert pgfence:fence: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The proof that this transaction fenced resource: a keyed hash of the transaction id and the
-- resource name. It is worthless in any other transaction, and from a session-level SET.
-- Inlined like sign: fence and the guard compute it on every fenced transaction and every
-- protected write.
create or replace function pgfence.fence_token(resource text, key bytea)
returns text
language sql
stable
as $$
  select pgfence.sign(pg_catalog.format('fence %s %s', pg_catalog.pg_current_xact_id(), fence_token.resource),
                      fence_token.key);
$$;
revoke all on function pgfence.fence_token(text, bytea) from public;

create or replace function pgfence.fence(lease_id uuid)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_state text;
  v_expires_at timestamptz;
  v_generation bigint;
  v_token text;
  v_marker text;
begin
  perform pgfence.check_not_null('lease_id', fence.lease_id);
  -- FOR KEY SHARE, held to the end of the caller's transaction: a takeover, drain or release
  -- needs FOR UPDATE on this row and waits until then (I2). Concurrent fences of the same
  -- lease and renewals do not conflict with it.
  select l.state, l.expires_at, l.generation, pgfence.fence_token(l.resource, k.key)
    into v_state, v_expires_at, v_generation, v_token
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id = fence.lease_id
     for key share of l;
  -- Judged after the lock wait, on the clock of this moment (I7).
  if not found or v_state <> 'active' or v_expires_at <= clock_timestamp() then
    perform pgfence.lease_not_current(fence.lease_id);
  end if;
  -- A transaction-local marker for the guard of protected tables: it lives exactly as long
  -- as the row lock above (both end at commit, rollback or rollback to an earlier savepoint).
  v_marker := coalesce(nullif(current_setting('pgfence.fenced', true), ''), E'\n');
  if strpos(v_marker, E'\n' || v_token || E'\n') = 0 then
    perform set_config('pgfence.fenced', v_marker || v_token || E'\n', true);
  end if;
  return v_generation;
end
$$;
comment on function pgfence.fence(uuid) is
  'Call inside the transaction it protects: returns the generation if the lease is the resource''s active, '
  'unexpired lease, and keeps it so until the transaction ends. Raises PF001 otherwise.';

revoke all on function pgfence.fence(uuid) from public;
grant execute on function pgfence.fence(uuid) to pgfence_worker;

drop function pgfence.mark_fenced(text, bytea);

commit;

-- Deploy pgfence:cancel_invocations
-- requires: invocations
-- requires: resources
-- requires: checks
-- requires: errors
-- requires: lock_resources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A pending invocation holds off every other start of its resource until it expires or an
-- acquire presents it. When the start it asked for is known to have failed (the supervisor's
-- request never reached a runtime), an operator need not wait: this ends the pending ones
-- now. It grants and revokes nothing else; a late acquire presenting one is still accepted.
create function pgfence.cancel_invocations(resource text)
returns integer
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_count integer;
begin
  perform pgfence.check_name('resource', cancel_invocations.resource);
  -- The resource row, as request_start takes it: a concurrent request_start either sees the
  -- invocations still pending or runs after this and may start anew.
  perform pgfence.lock_resources(array[cancel_invocations.resource]);
  perform from pgfence.resources r where r.resource = cancel_invocations.resource;
  if not found then
    perform pgfence.resource_not_found(cancel_invocations.resource);
  end if;
  update pgfence.invocations i
     set expires_at = clock_timestamp()
   where i.resource = cancel_invocations.resource and i.acknowledged_at is null
     and i.expires_at > clock_timestamp();
  get diagnostics v_count = row_count;
  return v_count;
end
$$;
comment on function pgfence.cancel_invocations(text) is
  'Operator: the resource''s pending startup invocations expire now, so request_start may start it again; '
  'returns how many. Raises PF002, 22023.';

revoke all on function pgfence.cancel_invocations(text) from public;
grant execute on function pgfence.cancel_invocations(text) to pgfence_operator;

commit;

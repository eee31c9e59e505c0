-- Revert pgfence:request_start: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.request_start(resource text, ttl interval default '1 minute')
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_enabled boolean;
  v_invocation_id uuid;
begin
  perform pgfence.check_name('resource', request_start.resource);
  perform pgfence.check_interval('ttl', request_start.ttl);
  -- The resource row serializes request_start with acquire and with other callers: of
  -- concurrent callers exactly one finds nothing pending.
  select r.enabled into v_enabled
    from pgfence.resources r
   where r.resource = request_start.resource
     for no key update;
  if not found then
    perform pgfence.resource_not_found(request_start.resource);
  end if;
  if not v_enabled
     or exists (select from pgfence.leases l
                 where l.resource = request_start.resource and l.state = 'active'
                   and l.expires_at > clock_timestamp())
     or exists (select from pgfence.invocations i
                 where i.resource = request_start.resource and i.acknowledged_at is null
                   and i.expires_at > clock_timestamp()) then
    return null;
  end if;
  insert into pgfence.invocations (invocation_id, resource, requested_at, expires_at)
  values (gen_random_uuid(), request_start.resource, clock_timestamp(), clock_timestamp() + request_start.ttl)
  returning invocation_id into v_invocation_id;
  return v_invocation_id;
end
$$;
comment on function pgfence.request_start(text, interval) is
  'Startup handshake: a new invocation id when the resource is enabled, has no current lease and no '
  'unexpired pending invocation; otherwise NULL. The acquire that presents it acknowledges it. Raises PF002, 22023.';

revoke all on function pgfence.request_start(text, interval) from public;
grant execute on function pgfence.request_start(text, interval) to pgfence_worker, pgfence_operator;

commit;

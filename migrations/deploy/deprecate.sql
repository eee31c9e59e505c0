-- Deploy pgfence:deprecate
-- requires: lock_resources
-- requires: leases
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.deprecate(resource text)
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_lease_id uuid;
begin
  perform pgfence.check_name('resource', deprecate.resource);
  perform pgfence.lock_resources(array[deprecate.resource]);
  perform from pgfence.resources r where r.resource = deprecate.resource;
  if not found then
    perform pgfence.resource_not_found(deprecate.resource);
  end if;
  select l.lease_id into v_lease_id
    from pgfence.leases l
   where l.resource = deprecate.resource and l.state = 'active'
     for update;
  if found then
    update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
     where l.lease_id = v_lease_id;
  end if;
  return v_lease_id;
end
$$;
comment on function pgfence.deprecate(text) is
  'Operator: the active lease becomes draining (it finishes what it holds, claims nothing); returns its lease_id or NULL. Raises PF002.';

revoke all on function pgfence.deprecate(text) from public;
grant execute on function pgfence.deprecate(text) to pgfence_operator;

commit;

-- Deploy pgfence:set_enabled
-- requires: lock_resources
-- requires: resources
-- requires: checks
-- requires: errors
-- requires: layer_hooks
--
-- Reworked in 0.3.0: the layers are told (their enabled_changed hook).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.set_enabled(resource text, enabled boolean)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_previous boolean;
begin
  perform pgfence.check_name('resource', set_enabled.resource);
  perform pgfence.check_not_null('enabled', set_enabled.enabled);
  perform pgfence.lock_resources(array[set_enabled.resource]);
  select r.enabled into v_previous from pgfence.resources r where r.resource = set_enabled.resource;
  if not found then
    raise exception 'pgfence: resource % is not registered', set_enabled.resource
      using errcode = 'PF002', hint = 'register it first with pgfence.register(resource)';
  end if;
  update pgfence.resources r
     set enabled = set_enabled.enabled,
         enabled_version = r.enabled_version + 1
   where r.resource = set_enabled.resource;
  perform pgfence.enabled_changed(array[set_enabled.resource]);
  return v_previous;
end
$$;
comment on function pgfence.set_enabled(text, boolean) is
  'Operator: sets enabled and returns the previous value. Raises PF002 for an unknown resource.';

revoke all on function pgfence.set_enabled(text, boolean) from public;
grant execute on function pgfence.set_enabled(text, boolean) to pgfence_operator;

commit;

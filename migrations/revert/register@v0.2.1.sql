-- Revert pgfence:register: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.register(resource text, enabled boolean default true)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_name('resource', register.resource);
  perform pgfence.check_not_null('enabled', register.enabled);
  -- An existing resource keeps its enabled: registration never enables anything (I6).
  insert into pgfence.resources (resource, enabled)
  values (register.resource, register.enabled)
  on conflict on constraint resources_pkey do nothing;
end
$$;
comment on function pgfence.register(text, boolean) is
  'Registers a resource; idempotent. Never changes an existing resource''s enabled. Raises 22023 on a bad name.';

revoke all on function pgfence.register(text, boolean) from public;
grant execute on function pgfence.register(text, boolean) to pgfence_worker, pgfence_operator;

commit;

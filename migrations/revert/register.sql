-- Revert pgfence:register: back to release 0.2.1's, a worker may register again
-- requires: limit_idle
-- requires: resources
-- requires: checks

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
  -- A new row, uncommitted, makes every other register of the name wait for it.
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
end
$$;
comment on function pgfence.register(text, boolean) is
  'Registers a resource; idempotent. Never changes an existing resource''s enabled. Raises 22023 on a bad name.';

-- The grants in 0.2.1's order (the worker's first), as pg_dump lists them.
revoke all on function pgfence.register(text, boolean) from public, pgfence_operator;
grant execute on function pgfence.register(text, boolean) to pgfence_worker, pgfence_operator;

commit;

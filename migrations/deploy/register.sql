-- Deploy pgfence:register
-- requires: limit_idle
-- requires: resources
-- requires: checks
-- requires: layer_hooks
--
-- Reworked in 0.3.0: registering a name is the operator's, no longer a worker's (issue 43 item
-- 4). A resource is configuration (enabled, windows and protections name it), and nothing
-- removes one but an operator (pgfence.unregister): a worker that could register would grow
-- the table without bound, and a retention that forgot unused resources by age would make a
-- rarely run worker's next acquire fail PF002 (docs/contract.md, "Resources"). And a new
-- resource's enabled is passed on to the layers (their enabled_changed hook), as every change of
-- enabled is.

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
declare
  v_new int;
begin
  perform pgfence.check_name('resource', register.resource);
  perform pgfence.check_not_null('enabled', register.enabled);
  -- An existing resource keeps its enabled: registration never enables anything (I6).
  insert into pgfence.resources (resource, enabled)
  values (register.resource, register.enabled)
  on conflict on constraint resources_pkey do nothing;
  get diagnostics v_new = row_count;
  -- A new row, uncommitted, makes every other register of the name wait for it.
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
  if v_new > 0 then
    perform pgfence.enabled_changed(array[register.resource]);
  end if;
end
$$;
comment on function pgfence.register(text, boolean) is
  'Registers a resource; idempotent. Never changes an existing resource''s enabled. Raises 22023 on a bad name.';

revoke all on function pgfence.register(text, boolean) from public, pgfence_worker;
grant execute on function pgfence.register(text, boolean) to pgfence_operator;

commit;

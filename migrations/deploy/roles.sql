-- Deploy pgfence:roles
-- The three NOLOGIN roles that login roles are granted. Roles are cluster-wide and may be
-- shared by several databases, so they are created only when missing and revert leaves them.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
declare
  v_role text;
begin
  foreach v_role in array array['pgfence_worker', 'pgfence_operator', 'pgfence_monitor'] loop
    if not exists (select from pg_catalog.pg_roles where rolname = v_role) then
      execute format('create role %I nologin', v_role);
    end if;
  end loop;
end
$$;

commit;

-- Deploy pgfence:roles
-- The three NOLOGIN roles that login roles are granted. Roles are cluster-wide and may be
-- shared by several databases, so they are created only when missing and revert leaves them.

begin;

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

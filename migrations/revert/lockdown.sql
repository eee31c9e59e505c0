-- Revert pgfence:lockdown: back to its definition of release 0.2.1

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.lockdown(schema_name name)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_schema oid := (select n.oid from pg_catalog.pg_namespace n where n.nspname = lockdown.schema_name);
  v_allowed oid[] := array(select oid from pg_catalog.pg_roles
                            where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'));
  v_grant record;
begin
  -- pgfence's own schemas only: the core's, and a layer's (pgfence_NAME).
  if v_schema is null or not (lockdown.schema_name = 'pgfence' or lockdown.schema_name like 'pgfence\_%') then
    raise exception 'pgfence.lockdown: % is not a pgfence schema', coalesce(quote_ident(lockdown.schema_name), 'NULL')
      using errcode = '22023';
  end if;
  for v_grant in
    select format('revoke all on function %s from %s', p.oid::regprocedure,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end) as stmt
      from pg_catalog.pg_proc p, aclexplode(p.proacl) a
     where p.pronamespace = v_schema
       and a.grantee <> p.proowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all on %s from %s', c.oid::regclass,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_class c, aclexplode(c.relacl) a
     where c.relnamespace = v_schema
       and a.grantee <> c.relowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all (%I) on %s from %s', t.attname, c.oid::regclass,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_class c
      join pg_catalog.pg_attribute t on t.attrelid = c.oid and t.attacl is not null,
           aclexplode(t.attacl) a
     where c.relnamespace = v_schema
       and a.grantee <> c.relowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all on type %s from %s', y.oid::regtype,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_type y, aclexplode(y.typacl) a
     where y.typnamespace = v_schema and y.typtype in ('d', 'e', 'r', 'm')
       and a.grantee <> y.typowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all on schema %I from %s', n.nspname,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_namespace n, aclexplode(n.nspacl) a
     where n.oid = v_schema
       and a.grantee <> n.nspowner and a.grantee <> all (v_allowed)
  loop
    execute v_grant.stmt;
  end loop;
end
$$;
comment on function pgfence.lockdown(name) is
  'Installer: revokes every privilege on schema_name (pgfence or a layer''s pgfence_NAME) and its objects but the '
  'owners'' and the three pgfence roles''. Run last by every install and upgrade of the core and of each layer.';
revoke all on function pgfence.lockdown(name) from public;
drop function pgfence.foreign_grants(name);

-- 0.3.0's lockdown also revokes PUBLIC's default USAGE of the schema's own composite type, which
-- 0.2.1's never did: given back, as 0.2.1 installs it.
grant usage on type pgfence.lease to public;

commit;

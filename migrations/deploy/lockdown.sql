-- Deploy pgfence:lockdown
-- requires: releases
--
-- Whatever default privileges the database carries (Supabase-style `alter default privileges
-- ... grant execute on functions to anon`, say), nobody but the owners and the three pgfence
-- roles keeps a privilege on a pgfence schema or anything in it. Revoking from PUBLIC alone
-- would not undo such grants.
--
-- One function, pgfence.lockdown(schema), that each layer applies to its own schema too, run
-- by pgfence.seal at the end of every release of the core and of each layer. Until 0.2.1 each
-- release reworked this change to run it last; 0.3.0 reworks it for the last time, so that
-- lockdown and health share one rule: pgfence.foreign_grants, every privilege it revokes.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Every privilege on a pgfence schema (the core's, or a layer's pgfence_NAME) or on anything in
-- it (functions, relations, columns, types) held by someone other than the object's owner and
-- the three pgfence roles: what lockdown revokes, and what health names. A NULL ACL counts as
-- the default it stands for (PUBLIC may execute a function): a restore without its grants
-- (pg_restore --no-acl) leaves every function's ACL NULL.
create function pgfence.foreign_grants(schema_name name)
returns table (grantee text, privilege text, object text, revoke text)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  with s as (select n.oid from pg_namespace n
              where n.nspname = foreign_grants.schema_name
                and (n.nspname = 'pgfence' or n.nspname like 'pgfence\_%')),
  allowed as (select oid from pg_roles where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor')),
  g as (
    select a.grantee, a.privilege_type, format('function %s', p.oid::regprocedure) as object,
           format('revoke all on function %s from %%s', p.oid::regprocedure) as stmt
      from pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
     where p.pronamespace in (select oid from s) and a.grantee <> p.proowner
    union all
    select a.grantee, a.privilege_type, format('relation %s', c.oid::regclass),
           format('revoke all on %s from %%s', c.oid::regclass)
      from pg_class c, aclexplode(coalesce(c.relacl, acldefault(case c.relkind when 'S' then 's' else 'r' end::"char", c.relowner))) a
     where c.relnamespace in (select oid from s) and a.grantee <> c.relowner
    union all
    select a.grantee, a.privilege_type, format('column %s.%I', c.oid::regclass, t.attname),
           format('revoke all (%I) on %s from %%s', t.attname, c.oid::regclass)
      from pg_class c
      join pg_attribute t on t.attrelid = c.oid and t.attacl is not null,
           aclexplode(t.attacl) a
     where c.relnamespace in (select oid from s) and a.grantee <> c.relowner
    union all
    select a.grantee, a.privilege_type, format('type %s', y.oid::regtype),
           format('revoke all on type %s from %%s', y.oid::regtype)
      from pg_type y, aclexplode(coalesce(y.typacl, acldefault('T', y.typowner))) a
     where y.typnamespace in (select oid from s) and a.grantee <> y.typowner
       and (y.typtype in ('d', 'e', 'r', 'm')  -- and a composite type of its own (pgfence.lease)
            or y.typtype = 'c' and (select c.relkind from pg_class c where c.oid = y.typrelid) = 'c')
    union all
    select a.grantee, a.privilege_type, format('schema %I', n.nspname),
           format('revoke all on schema %I from %%s', n.nspname)
      from pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
     where n.oid in (select oid from s) and a.grantee <> n.nspowner)
  select case g.grantee when 0 then 'PUBLIC' else g.grantee::regrole::text end, g.privilege_type, g.object,
         format(g.stmt, case g.grantee when 0 then 'public' else quote_ident(g.grantee::regrole::text) end)
    from g
   where g.grantee not in (select oid from allowed)
   order by 3, 1, 2;
$$;
comment on function pgfence.foreign_grants(name) is
  'Every privilege on a pgfence schema or its objects held by anyone but the owners and the three pgfence roles.';

-- Only the owner runs it (no grant): as the installer.
create or replace function pgfence.lockdown(schema_name name)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_stmt text;
begin
  -- pgfence's own schemas only: the core's, and a layer's (pgfence_NAME).
  if pg_catalog.to_regnamespace(lockdown.schema_name) is null
     or not (lockdown.schema_name = 'pgfence' or lockdown.schema_name like 'pgfence\_%') then
    raise exception 'pgfence.lockdown: % is not a pgfence schema', coalesce(quote_ident(lockdown.schema_name), 'NULL')
      using errcode = '22023';
  end if;
  for v_stmt in select distinct g.revoke from pgfence.foreign_grants(lockdown.schema_name) g loop
    execute v_stmt;
  end loop;
end
$$;
comment on function pgfence.lockdown(name) is
  'Installer: revokes every privilege on schema_name (pgfence or a layer''s pgfence_NAME) and its objects but the '
  'owners'' and the three pgfence roles'' (pgfence.foreign_grants). Run by pgfence.seal at the end of every release.';
revoke all on function pgfence.lockdown(name), pgfence.foreign_grants(name) from public;

commit;

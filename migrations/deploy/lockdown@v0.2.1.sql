-- Deploy pgfence:lockdown
-- requires: register
-- requires: set_enabled
-- requires: acquire
-- requires: renew
-- requires: drain
-- requires: release
-- requires: deprecate
-- requires: protect
-- requires: request_start
-- requires: enqueue
-- requires: claim
-- requires: complete
-- requires: fail
-- requires: extend
-- requires: requeue_expired
-- requires: prepare_update
-- requires: update_status
-- requires: finish_update
-- requires: open_updates
-- requires: lease_status
-- requires: resource_status
-- requires: queue_status
-- requires: version
-- requires: cancel_invocations
-- requires: protected_tables
-- requires: complete_many
--
-- The last change, run again after any other: whatever default privileges the database
-- carries (Supabase-style `alter default privileges ... grant execute on functions to anon`,
-- say), nobody but pgfence's owner and the three pgfence roles keeps a privilege on anything
-- in schema pgfence. Revoking from PUBLIC alone would not undo such grants.
--
-- Release 0.2.0 makes it one function, pgfence.lockdown(schema), that every layer applies to
-- its own schema too, and runs it again after its own changes. (Each release reworks this change and
-- says so here: Sqitch refuses two changes with the same script.) Release 0.2.1 reworks it
-- unchanged, to run last again after version.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One function, so that each optional layer (layers/*) applies to its own schema exactly the
-- rule the core applies to its own: nobody but the schema's owner, each object's owner and the
-- three pgfence roles keeps a privilege on the schema or anything in it. Revoking from PUBLIC
-- alone would not undo default privileges. Only the owner runs it (no grant): as the installer.
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

-- health's record of what the release installed (pgfence.manifest, written by the health
-- change just before this one) takes in this change's function too: lockdown is the last change.
insert into pgfence.manifest
select o.object, o.digest from pgfence.schema_objects() o
 where o.object = 'function pgfence.lockdown(schema_name name)'
on conflict (object) do update set digest = excluded.digest;

do $$ begin perform pgfence.lockdown('pgfence'); end $$;

commit;

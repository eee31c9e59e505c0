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
-- Release 0.2.0 runs it again, after its own changes. (Each release reworks this change and
-- says so here: Sqitch refuses two changes with the same script.)

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
declare
  v_allowed oid[] := array(select oid from pg_catalog.pg_roles
                            where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'));
  v_grant record;
begin
  for v_grant in
    select format('revoke all on function %s from %s', p.oid::regprocedure,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end) as stmt
      from pg_catalog.pg_proc p, aclexplode(p.proacl) a
     where p.pronamespace = 'pgfence'::regnamespace
       and a.grantee <> p.proowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all on %s from %s', c.oid::regclass,
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_class c, aclexplode(c.relacl) a
     where c.relnamespace = 'pgfence'::regnamespace
       and a.grantee <> c.relowner and a.grantee <> all (v_allowed)
    union all
    select format('revoke all on schema pgfence from %s',
                  case a.grantee when 0 then 'public' else quote_ident(a.grantee::regrole::text) end)
      from pg_catalog.pg_namespace n, aclexplode(n.nspacl) a
     where n.oid = 'pgfence'::regnamespace
       and a.grantee <> n.nspowner and a.grantee <> all (v_allowed)
  loop
    execute v_grant.stmt;
  end loop;
end
$$;

commit;

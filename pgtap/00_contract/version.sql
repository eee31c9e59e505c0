-- pgfence.version(): the installed release, callable by every pgfence role and nobody else.
begin;
select plan(7);

select has_function('pgfence', 'version', array[]::text[], 'version() exists');
select function_returns('pgfence', 'version', array[]::text[], 'text', 'version returns text');
select matches(pgfence.version(), '^\d+\.\d+\.\d+$', 'version() is a release number X.Y.Z');
select ok(has_function_privilege('pgfence_monitor', 'pgfence.version()', 'execute'), 'pgfence_monitor may call version()');
select ok(has_function_privilege('pgfence_worker', 'pgfence.version()', 'execute'), 'pgfence_worker may call version()');
select ok(has_function_privilege('pgfence_operator', 'pgfence.version()', 'execute'), 'pgfence_operator may call version()');
select ok(not exists (select from pg_catalog.pg_proc p, aclexplode(p.proacl) a
                       where p.oid = 'pgfence.version()'::regprocedure and a.grantee = 0),
          'PUBLIC may not call version()');

select * from finish();
rollback;

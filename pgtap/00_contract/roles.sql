-- The three pgfence roles, and what PUBLIC and the monitor can see of the schema.
begin;
select plan(16);
select pgfence_test.reset();

select has_role('pgfence_worker', 'role pgfence_worker exists');
select has_role('pgfence_operator', 'role pgfence_operator exists');
select has_role('pgfence_monitor', 'role pgfence_monitor exists');
select is((select rolcanlogin from pg_catalog.pg_roles where rolname = 'pgfence_worker'), false,
          'pgfence_worker cannot log in');
select is((select rolcanlogin from pg_catalog.pg_roles where rolname = 'pgfence_operator'), false,
          'pgfence_operator cannot log in');
select is((select rolcanlogin from pg_catalog.pg_roles where rolname = 'pgfence_monitor'), false,
          'pgfence_monitor cannot log in');
select is_empty($$ select rolname from pg_catalog.pg_roles
                    where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor')
                      and (rolsuper or rolcreaterole or rolcreatedb or rolbypassrls) $$,
                'no pgfence role is a superuser or may create roles or databases or bypass row security');

select is_empty($$ select c.oid::regclass::text
                     from pg_catalog.pg_class c
                    where c.relnamespace = 'pgfence'::regnamespace
                      and c.relkind in ('r', 'p', 'v', 'm', 'f')
                      and has_table_privilege('public', c.oid,
                            'select, insert, update, delete, truncate, references, trigger') $$,
                'PUBLIC has no privilege on any table or view in schema pgfence');
select is_empty($$ select c.oid::regclass::text
                     from pg_catalog.pg_class c
                    where c.relnamespace = 'pgfence'::regnamespace
                      and case when c.relkind = 'S'  -- guards the call: it refuses non-sequences
                               then has_sequence_privilege('public', c.oid, 'usage, select, update')
                               else false end $$,
                'PUBLIC has no privilege on any sequence in schema pgfence');
select ok(not has_schema_privilege('public', 'pgfence', 'create'),
          'PUBLIC cannot create objects in schema pgfence');

select table_privs_are('pgfence', 'resource_status', 'pgfence_monitor', array['SELECT'],
                       'a monitor can read resource_status and nothing more');
select table_privs_are('pgfence', 'lease_status', 'pgfence_monitor', array['SELECT'],
                       'a monitor can read lease_status and nothing more');
select table_privs_are('pgfence', 'resources', 'pgfence_worker', array[]::text[],
                       'a worker cannot touch the resources table directly');
select table_privs_are('pgfence', 'leases', 'pgfence_monitor', array[]::text[],
                       'a monitor cannot read the leases table, where the lease ids are');

-- Lease ids are capabilities: the monitoring views never show them.
select hasnt_column('pgfence', 'lease_status', 'lease_id', 'lease_status shows no lease_id');
select hasnt_column('pgfence', 'resource_status', 'lease_id', 'resource_status shows no lease_id');

select * from finish();
rollback;

-- The pgflow layer's worker registration (change pgflow_workers), on the pgflow the suite
-- installs (npm @pgflow/core 0.8.1: no worker_functions, no stopped_at): its functions
-- (SECURITY DEFINER but setup_cron, pinned search_path, the operator's, nobody else's), the
-- hook that follows pgfence's resources, and the worker rows: a superseded lease's
-- deprecated by sync_workers; pgfence.prune deleting the ended rows older than the bound,
-- never a live worker's, and saying so as its 'pgflow.workers' row. pgflow 0.14's
-- registration (worker_functions, ensure_workers, requeue) is in tests/test_pgflow14.py.
begin;
select plan(22);
-- reset() forgets pgfence.layers too: the layer's registration is put back, for pgfence.prune.
create temp table layers on commit drop as select * from pgfence.layers;
select pgfence_test.reset();
insert into pgfence.layers select * from layers;

select has_function('pgfence_pgflow', 'sync_workers', array[]::text[], 'sync_workers()');
select has_function('pgfence_pgflow', 'ensure_workers', array[]::text[], 'ensure_workers()');
select has_function('pgfence_pgflow', 'requeue_stalled_tasks', array[]::text[], 'requeue_stalled_tasks()');
select has_function('pgfence_pgflow', 'prune_workers', array['interval'], 'prune_workers(older_than)');
select has_function('pgfence_pgflow', 'setup_cron', array[]::text[], 'setup_cron()');
select is((select count(*)::int from pg_proc p
            where p.pronamespace = 'pgfence_pgflow'::regnamespace
              and p.proname in ('sync_workers', 'ensure_workers', 'requeue_stalled_tasks', 'prune_workers',
                                'as_maintenance', 'follow_resource')
              and p.prosecdef and p.proconfig @> array['search_path=pg_catalog, pg_temp']),
          6, 'the maintenance functions are SECURITY DEFINER with a pinned search_path');
select isnt_definer('pgfence_pgflow', 'setup_cron', array[]::text[],
                    'setup_cron runs as its caller (it alters pgflow''s cron jobs with the caller''s rights)');
select is((select count(*)::int from pg_proc p
            where p.pronamespace = 'pgfence_pgflow'::regnamespace
              and p.proname in ('sync_workers', 'ensure_workers', 'requeue_stalled_tasks', 'prune_workers',
                                'setup_cron', 'as_maintenance', 'follow_resource')
              and has_function_privilege('public', p.oid, 'execute')),
          0, 'PUBLIC executes none of them');
select function_privs_are('pgfence_pgflow', 'prune_workers', array['interval'], 'pgfence_operator', array['EXECUTE'],
                          'the operator prunes worker rows');
select function_privs_are('pgfence_pgflow', 'ensure_workers', array[]::text[], 'pgfence_operator', array['EXECUTE'],
                          'the operator runs ensure_workers');
select function_privs_are('pgfence_pgflow', 'prune_workers', array['interval'], 'pgfence_worker', array[]::text[],
                          'a worker does not prune');
select function_privs_are('pgfence_pgflow', 'as_maintenance', array['text', 'interval'], 'pgfence_operator',
                          array[]::text[], 'nobody calls as_maintenance directly, not even the operator');
-- A change of a resource reaches pgflow through the core's hook, not a trigger on the core's table.
select is((select enabled_changed::text from pgfence.layers where schema_name = 'pgfence_pgflow'),
          'pgfence_pgflow.enabled_changed(text[])', 'pgfence.resources changes reach pgflow.worker_functions (the hook)');
select is((select count(*)::int from pg_trigger where tgrelid = 'pgfence.resources'::regclass and not tgisinternal),
          0, 'no layer puts a trigger on pgfence.resources');

-- Two runs; owner-a starts and completes a task, its lease is superseded by owner-b's, which
-- starts and completes the other run's, then idles, holding its lease. No heartbeat since.
select pgflow.create_flow('two');
select pgflow.add_step('two', 'first');
select pgflow.start_flow('two', '{"n": 1}');
select pgflow.start_flow('two', '{"n": 2}');
create temp table a on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
create temp table a_got on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from a), 'two', 'two', '30 s', 1);
select is(pgfence_pgflow.complete_task((select attempt_id from a_got), '{}'), 'accepted', 'owner-a''s result');
select pgfence_test.expire((select lease_id from a));
create temp table b on commit drop as select pgfence_test.lease('fn', 'owner-b') as lease_id;
create temp table b_got on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from b), 'two', 'two', '30 s', 1);
select is(pgfence_pgflow.complete_task((select attempt_id from b_got), '{}'), 'accepted', 'owner-b''s result');
select is((select count(*)::int from pgflow.workers), 2, 'a worker row each');
update pgflow.workers set last_heartbeat_at = now() - interval '8 days';
create temp table b_worker on commit drop as
  select wl.worker_id from pgfence_pgflow.worker_leases wl where wl.lease_id = (select lease_id from b);

select is(pgfence_pgflow.sync_workers(), 1::bigint, 'sync_workers marks one row');
select results_eq($$ select w.worker_id = (select worker_id from b_worker), w.deprecated_at is null
                       from pgflow.workers w order by 1 $$,
                  $$ values (false, false), (true, true) $$,
                  'owner-a''s row (its lease superseded) is deprecated, owner-b''s is not');

select is((select p.rows from pgfence.prune('7 days') p where p.what = 'pgflow.workers'), 1::bigint,
          'pgfence.prune deletes the ended worker row and says so');
select results_eq($$ select worker_id from pgflow.workers $$, $$ select worker_id from b_worker $$,
                  'the live, idle worker''s row stays, however old its heartbeat');
select results_eq($$ select worker_id from pgfence_pgflow.worker_leases $$, $$ select worker_id from b_worker $$,
                  'and the layer''s record of the deleted row is gone with it');

select * from finish();
rollback;

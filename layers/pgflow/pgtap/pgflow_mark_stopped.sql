-- pgfence_pgflow.mark_worker_stopped (change pgflow_mark_stopped): a fenced worker marks its
-- pgflow.workers row stopped as it ends, naming it by the lease it last started under; only
-- once that lease is no longer live, and only if no newer lease of the worker started since.
-- On the pgflow the suite installs (0.8.1, no stopped_at) the row is deprecated instead.
begin;
select plan(12);
select pgfence_test.reset();

select has_function('pgfence_pgflow', 'mark_worker_stopped', array['uuid'], 'mark_worker_stopped(lease_id)');
select is_definer('pgfence_pgflow', 'mark_worker_stopped', array['uuid'], 'SECURITY DEFINER');
select ok((select p.proconfig @> array['search_path=pg_catalog, pg_temp'] from pg_proc p
            where p.oid = 'pgfence_pgflow.mark_worker_stopped(uuid)'::regprocedure),
          'with a pinned search_path');
select function_privs_are('pgfence_pgflow', 'mark_worker_stopped', array['uuid'], 'public', array[]::text[],
                          'PUBLIC may not execute it');
select function_privs_are('pgfence_pgflow', 'mark_worker_stopped', array['uuid'], 'pgfence_worker', array['EXECUTE'],
                          'a worker may');
select throws_ok($$ select pgfence_pgflow.mark_worker_stopped(null) $$, '22023', null, 'a NULL lease_id is refused');

select pgflow.create_flow('two');
select pgflow.add_step('two', 'first');
select pgflow.start_flow('two', '{"n": 1}');
select pgflow.start_flow('two', '{"n": 2}');
create temp table a on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
select is((select count(*)::int from pgfence_pgflow.start_tasks((select lease_id from a), 'two', 'two', '30 s', 1)), 1,
          'owner-a starts a task: its worker row');

select is(pgfence_pgflow.mark_worker_stopped((select lease_id from a)), false,
          'a worker still holding its lease is not marked stopped');
select is(pgfence_pgflow.mark_worker_stopped(gen_random_uuid()), false, 'an unknown lease marks nothing');

-- owner-a's next lease (a supervised worker acquiring again) starts the other run's task.
select pgfence.release((select lease_id from a));
create temp table a2 on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
select pgfence_pgflow.start_tasks((select lease_id from a2), 'two', 'two', '30 s', 1);
select is(pgfence_pgflow.mark_worker_stopped((select lease_id from a)), false,
          'an older lease of the worker marks nothing once a newer one started');

select pgfence.release((select lease_id from a2));
select is(pgfence_pgflow.mark_worker_stopped((select lease_id from a2)), true,
          'its last lease released, the worker marks its row');
select is((select count(*)::int from pgflow.workers where deprecated_at is not null), 1,
          'the one row is marked (deprecated_at: pgflow 0.8 has no stopped_at)');

select * from finish();
rollback;

-- The pgflow layer: its contract (signatures, SECURITY DEFINER with a pinned search_path, no
-- PUBLIC execute); start_tasks under a current lease only; every bad argument 22023, nothing
-- changed; one task started, completed (accepted, then duplicate); a task taken over after its
-- message came back, the old attempt's result stale and recorded. The interleavings are in
-- tests/test_pgflow.py.
begin;
select plan(27);
select pgfence_test.reset();

select has_function('pgfence_pgflow', 'start_tasks', array['uuid', 'text', 'text', 'interval', 'integer'],
                    'start_tasks(lease_id, flow_slug, queue, vt, qty)');
select has_function('pgfence_pgflow', 'complete_task', array['uuid', 'jsonb'], 'complete_task(attempt_id, output)');
select has_function('pgfence_pgflow', 'fail_task', array['uuid', 'text'], 'fail_task(attempt_id, error_message)');
select is_definer('pgfence_pgflow', 'start_tasks', array['uuid', 'text', 'text', 'interval', 'integer'],
                  'start_tasks is SECURITY DEFINER');
select is_definer('pgfence_pgflow', 'finish', array['uuid', 'text', 'jsonb', 'text'], 'finish is SECURITY DEFINER');
select is((select count(*)::int from pg_proc p
            where p.pronamespace = 'pgfence_pgflow'::regnamespace and p.prosecdef
              and not coalesce(p.proconfig, '{}') @> array['search_path=pg_catalog, pg_temp']),
          0, 'every SECURITY DEFINER function of the layer pins search_path');
select is((select count(*)::int from pg_proc p
            where p.pronamespace = 'pgfence_pgflow'::regnamespace
              and has_function_privilege('public', p.oid, 'execute')),
          0, 'PUBLIC executes nothing in pgfence_pgflow');
select function_privs_are('pgfence_pgflow', 'start_tasks', array['uuid', 'text', 'text', 'interval', 'integer'],
                          'pgfence_worker', array['EXECUTE'], 'pgfence_worker may start tasks');

select pgflow.create_flow('two');
select pgflow.add_step('two', 'first');
select pgflow.add_step('two', 'second', array['first']);
select pgflow.start_flow('two', '{"n": 1}');
create temp table held on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
create temp table old on commit drop as select pgfence_test.superseded_lease('old') as lease_id;

-- Bad arguments change nothing.
select throws_ok($$ select * from pgfence_pgflow.start_tasks(null, 'two', 'two', '30 s') $$, '22023', null, 'NULL lease_id');
select throws_ok($$ select * from pgfence_pgflow.start_tasks((select lease_id from held), 'nosuch', 'nosuch', '30 s') $$,
                 '22023', 'pgfence: invalid argument flow_slug: no such pgflow flow', 'an unknown flow');
select throws_ok($$ select * from pgfence_pgflow.start_tasks((select lease_id from held), 'two', 'other', '30 s') $$,
                 '22023', 'pgfence: invalid argument queue: must be the flow''s queue, named as the flow', 'another queue');
select throws_ok($$ select * from pgfence_pgflow.start_tasks((select lease_id from held), 'two', 'two', '0 s') $$,
                 '22023', null, 'vt 0');
select throws_ok($$ select * from pgfence_pgflow.start_tasks((select lease_id from held), 'two', 'two', '30 s', 0) $$,
                 '22023', null, 'qty 0');
select throws_ok($$ select pgfence_pgflow.complete_task(null, '{}') $$, '22023', null, 'NULL attempt_id');
select throws_ok($$ select pgfence_pgflow.fail_task(gen_random_uuid(), 'x') $$, '22023', null, 'an unknown attempt');
select is((select status || attempts_count from pgflow.step_tasks), 'queued0', 'no bad call started anything');

-- Only under the current lease.
select throws_ok($$ select * from pgfence_pgflow.start_tasks((select lease_id from old), 'two', 'two', '30 s') $$,
                 'PF001', null, 'a superseded lease starts nothing');
select throws_ok($$ select * from pgfence_pgflow.start_tasks(gen_random_uuid(), 'two', 'two', '30 s') $$,
                 'PF001', null, 'an unknown lease starts nothing');

-- A start, a completion, a retry of it.
create temp table got on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from held), 'two', 'two', '30 s', 5);
select results_eq($$ select step_slug, task_index, input from got $$,
                  $$ values ('first'::text, 0, '{"run": {"n": 1}}'::jsonb) $$, 'the first step''s task, with pgflow''s input');
select is((select status || attempts_count from pgflow.step_tasks where step_slug = 'first'), 'started1',
          'started by pgflow''s own start_tasks');
select is(pgfence_pgflow.complete_task((select attempt_id from got), '{"ok": 1}'), 'accepted', 'its result is accepted');
select is(pgfence_pgflow.complete_task((select attempt_id from got), '{"ok": 1}'), 'duplicate', 'a retry is a duplicate');
select is((select output from pgflow.step_tasks where step_slug = 'first'), '{"ok": 1}'::jsonb, 'pgflow has the output');

-- The second step's task is taken over once its message comes back.
create temp table second on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from held), 'two', 'two', '30 s', 5);
select pgfence_test.expire((select lease_id from held));
select pgfence_test.stall_task('two', (select msg_id from second));
create temp table successor on commit drop as select pgfence_test.lease('fn', 'owner-b') as lease_id;
create temp table again on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from successor), 'two', 'two', '30 s', 5);
select is((select step_slug from again), 'second', 'the successor started the second step''s task again');
select is(pgfence_pgflow.complete_task((select attempt_id from second), '{"by": "a"}'), 'stale',
          'the old attempt''s result is stale');
select is((select kind || ' ' || body::text from pgfence_pgflow.stale_results), 'complete {"by": "a"}',
          'and recorded');
select is(pgfence_pgflow.complete_task((select attempt_id from again), '{"by": "b"}'), 'accepted',
          'the new attempt''s is accepted');

select * from finish();
rollback;

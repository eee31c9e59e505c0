-- complete_many: complete's rule (I5) for each attempt of a batch, one row per id in the order
-- given: accepted from the attempt that holds the task (also after its lease expired),
-- duplicate for a retry, stale (recorded in pgfence.stale_results) from a superseded attempt.
-- A bad batch (NULL, empty, over 1000 ids, a NULL or repeated id, results of another length,
-- any id pgfence did not mint) is 22023 and changes nothing.
begin;
select plan(42);
select pgfence_test.reset();

create temp table held on commit drop as select pgfence_test.lease('r', 'owner-r') as lease_id;
select pgfence.enqueue('a', jsonb_build_object('n', n)) from generate_series(1, 4) n;
create temp table a on commit drop as select * from pgfence.claim((select lease_id from held), 'a', 4);

-- Accepted, in the order given, each with its own result.
select results_eq($$ select attempt_id, outcome
                       from pgfence.complete_many(array(select attempt_id from a where task_id <= 3 order by task_id desc),
                                                  array['{"r": 3}', '{"r": 2}', '{"r": 1}']::jsonb[]) $$,
                  $$ select attempt_id, 'accepted'::text from a where task_id <= 3 order by task_id desc $$,
                  'the attempts that hold their tasks complete them, one row per id in the order given');
select results_eq($$ select task_id, state, result from pgfence.tasks where queue = 'a' order by task_id $$,
                  $$ values (1::bigint, 'completed'::text, '{"r": 1}'::jsonb), (2, 'completed', '{"r": 2}'),
                            (3, 'completed', '{"r": 3}'), (4, 'claimed', null) $$,
                  'each task is completed with its own result; the task left out is untouched');
select ok((select bool_and(finished_at is not null and visible_until is null and reported)
             from pgfence.tasks where task_id <= 3),
          'the completed tasks have a finish time and are no longer held');
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 1::bigint,
          'the lease holds only the task left out');

-- A retry: duplicate, nothing overwritten.
select results_eq($$ select outcome from pgfence.complete_many(array(select attempt_id from a where task_id <= 3 order by task_id),
                                                               array['{"x": 1}', '{"x": 2}', '{"x": 3}']::jsonb[]) $$,
                  $$ values ('duplicate'::text), ('duplicate'), ('duplicate') $$,
                  'a retried batch is a duplicate for each attempt');
select results_eq($$ select result from pgfence.tasks where task_id <= 3 order by task_id $$,
                  $$ values ('{"r": 1}'::jsonb), ('{"r": 2}'), ('{"r": 3}') $$,
                  'and overwrites no result');

-- Without results: NULL stored.
select results_eq($$ select outcome from pgfence.complete_many(array(select attempt_id from a where task_id = 4)) $$,
                  $$ values ('accepted'::text) $$, 'a batch without results completes');
select is((select result from pgfence.tasks where task_id = 4), null::jsonb, 'and stores NULL');
select is(pgfence.complete((select attempt_id from a where task_id = 4)), 'duplicate',
          'complete agrees: the attempt has reported');

-- After the lease expired, before anyone claimed the tasks again: accepted.
create temp table expiring on commit drop as select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence.enqueue('b', '{}') from generate_series(1, 2);
create temp table b on commit drop as select * from pgfence.claim((select lease_id from expiring), 'b', 2);
select pgfence_test.expire(lease_id) from expiring;
select results_eq($$ select outcome from pgfence.complete_many(array(select attempt_id from b order by task_id),
                                                               array['{"late": 1}', '{"late": 2}']::jsonb[]) $$,
                  $$ values ('accepted'::text), ('accepted') $$,
                  'results after the lease expired, before any new claim, are accepted');
select results_eq($$ select t.state, t.result from pgfence.tasks t join b using (task_id) order by task_id $$,
                  $$ values ('completed'::text, '{"late": 1}'::jsonb), ('completed', '{"late": 2}') $$,
                  'and stored');

-- Stale: a task claimed again by a new attempt.
select pgfence.enqueue('c', jsonb_build_object('n', n)) from generate_series(1, 3) n;
create temp table c1 on commit drop as select * from pgfence.claim((select lease_id from held), 'c', 3);
select pgfence_test.expire_attempt(attempt_id) from c1 where payload->>'n' = '1';
select pgfence.requeue_expired();
create temp table c2 on commit drop as select * from pgfence.claim((select lease_id from held), 'c', 1);
select results_eq($$ select task_id, attempt from c2 $$, $$ select task_id, 2 from c1 where payload->>'n' = '1' $$,
                  'task c1 is claimed again, by attempt 2');
select results_eq($$ select outcome from pgfence.complete_many(array(select attempt_id from c1 where payload->>'n' = '1'),
                                                               array['{"from": "attempt 1"}']::jsonb[]) $$,
                  $$ values ('stale'::text) $$, 'the superseded attempt''s result is stale');
select results_eq($$ select s.attempt_id, s.task_id, s.attempt, s.kind, s.body from pgfence.stale_results s $$,
                  $$ select attempt_id, task_id, 1, 'complete'::text, '{"from": "attempt 1"}'::jsonb from c1 where payload->>'n' = '1' $$,
                  'and recorded with its attempt, task, kind and body');
select results_eq($$ select t.state, t.attempt, t.result from pgfence.tasks t join c2 using (task_id) $$,
                  $$ values ('claimed'::text, 2, null::jsonb) $$,
                  'the new attempt still holds the task');

-- A mixed batch: each outcome by complete's rule, in the order given.
create temp table mixed on commit drop as
  select * from pgfence.complete_many(
    array[(select attempt_id from c1 where payload->>'n' = '2'),  -- holds its task
          (select attempt_id from c1 where payload->>'n' = '1'),  -- superseded
          (select attempt_id from a where task_id = 1),            -- already completed
          (select attempt_id from c2),                             -- holds its task (attempt 2)
          (select attempt_id from c1 where payload->>'n' = '3')],  -- holds its task
    array['{"m": 1}', '{"m": 2}', '{"m": 3}', '{"m": 4}', '{"m": 5}']::jsonb[]) with ordinality as m(attempt_id, outcome, n);
select results_eq($$ select outcome from mixed order by n $$,
                  $$ values ('accepted'::text), ('stale'), ('duplicate'), ('accepted'), ('accepted') $$,
                  'a mixed batch: accepted, stale, duplicate, accepted, accepted, in the order given');
select results_eq($$ select attempt_id from mixed order by n $$,
                  $$ values ((select attempt_id from c1 where payload->>'n' = '2')), ((select attempt_id from c1 where payload->>'n' = '1')),
                            ((select attempt_id from a where task_id = 1)), ((select attempt_id from c2)),
                            ((select attempt_id from c1 where payload->>'n' = '3')) $$,
                  'each row names its attempt');
select results_eq($$ select (payload->>'n')::int, state, attempt, result from pgfence.tasks where queue = 'c' order by 1 $$,
                  $$ values (1, 'completed'::text, 2, '{"m": 4}'::jsonb), (2, 'completed', 1, '{"m": 1}'), (3, 'completed', 1, '{"m": 5}') $$,
                  'each accepted attempt''s result is stored; the stale one lands nowhere');
select is((select result from pgfence.tasks where task_id = 1), '{"r": 1}'::jsonb, 'the duplicate overwrote nothing');
select results_eq($$ select kind, body, report from pgfence.stale_results order by report $$,
                  $$ values ('complete'::text, '{"from": "attempt 1"}'::jsonb, 1), ('complete', '{"m": 2}', 2) $$,
                  'the stale attempt''s second, different result is recorded too');

-- Bad batches: 22023, nothing changed.
select pgfence.enqueue('g', jsonb_build_object('n', n)) from generate_series(1, 3) n;
create temp table g on commit drop as select * from pgfence.claim((select lease_id from held), 'g', 3);
create temp table g_ids on commit drop as select array_agg(attempt_id order by task_id) as ids from g;
select throws_ok($$ select * from pgfence.complete_many(null) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must not be NULL', 'a NULL array is refused');
select throws_ok($$ select * from pgfence.complete_many('{}') $$, '22023',
                 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'an empty array is refused');
select throws_ok($$ select * from pgfence.complete_many(array(select gen_random_uuid() from generate_series(1, 1001))) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'more than 1000 ids are refused');
select throws_ok($$ select * from pgfence.complete_many(array[[(select ids[1] from g_ids), (select ids[2] from g_ids)]]) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'a two-dimensional array is refused');
select throws_ok($$ select * from pgfence.complete_many((select ids || null::uuid from g_ids)) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must not contain NULL', 'a NULL id is refused');
select throws_ok($$ select * from pgfence.complete_many((select ids || ids[2] from g_ids)) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must not name an attempt twice', 'the same id twice is refused');
select throws_ok($$ select * from pgfence.complete_many((select ids from g_ids), array['{}', '{}']::jsonb[]) $$, '22023',
                 'pgfence: invalid argument results: must be NULL or a one-dimensional array of one result per attempt id',
                 'fewer results than ids are refused');
select throws_ok($$ select * from pgfence.complete_many((select ids from g_ids), array['{}', '{}', '{}', '{}']::jsonb[]) $$, '22023',
                 'pgfence: invalid argument results: must be NULL or a one-dimensional array of one result per attempt id',
                 'more results than ids are refused');
select throws_ok($$ select * from pgfence.complete_many((select ids || gen_random_uuid() from g_ids)) $$, '22023',
                 'pgfence: invalid argument attempt_id: is not an attempt id minted by pgfence.claim',
                 'a malformed id after valid ones fails the whole batch');
select throws_ok(format($$ select * from pgfence.complete_many(%L::uuid || (select ids from g_ids)) $$,
                        pgfence.attempt_uuid(999999, 1, gen_random_uuid())), '22023',
                 'pgfence: invalid argument attempt_id: no such attempt',
                 'a well-formed id of a task that does not exist, before valid ones, fails the whole batch');
select throws_ok(format($$ select * from pgfence.complete_many((select ids[1:2] from g_ids) || %L::uuid) $$,
                        pgfence_test.forged_attempt((select task_id from g where payload->>'n' = '3'), 1)), '22023',
                 'pgfence: invalid argument attempt_id: no such attempt',
                 'a forged id of the current attempt fails the whole batch');
select throws_ok(format($$ select * from pgfence.complete_many((select ids from g_ids) || %L::uuid) $$,
                        pgfence_test.forged_attempt((select task_id from c2), 1)), '22023', null,
                 'so does a forged id of an earlier attempt, which is not recorded as stale');
select results_eq($$ select t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id), t.result
                       from pgfence.tasks t join g using (task_id) order by task_id $$,
                  $$ select 'claimed'::text, attempt_id, null::jsonb from g order by task_id $$,
                  'the refused batches left every task as it was');
select is((select count(*) from pgfence.stale_results), 2::bigint, 'and recorded nothing as stale');
select results_eq($$ select outcome from pgfence.complete_many((select ids from g_ids)) $$,
                  $$ values ('accepted'::text), ('accepted'), ('accepted') $$,
                  'the valid batch still completes');

-- A batch of 1000.
select pgfence.enqueue('k', '{}') from generate_series(1, 1000);
create temp table k on commit drop as select * from pgfence.claim((select lease_id from held), 'k', 1000);
select is((select count(*) filter (where outcome = 'accepted')
             from pgfence.complete_many(array(select attempt_id from k order by task_id desc))), 1000::bigint,
          'a batch of 1000 attempts completes');
select is((select count(*) from pgfence.tasks where queue = 'k' and state = 'completed'), 1000::bigint,
          'all 1000 tasks');

-- Privileges.
select is_definer('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'complete_many runs as its owner');
select function_privs_are('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can complete a batch');
select ok(not has_function_privilege('public', 'pgfence.complete_many(uuid[], jsonb[])', 'execute'),
          'PUBLIC cannot');
select function_privs_are('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'pgfence_monitor',
                          array[]::text[], 'nor can a monitor');
select is((select proconfig from pg_catalog.pg_proc where oid = 'pgfence.complete_many(uuid[], jsonb[])'::regprocedure),
          array['search_path=pg_catalog, pg_temp', 'plan_cache_mode=force_generic_plan'],
          'its search_path is pinned; its plans are generic');

select * from finish();
rollback;

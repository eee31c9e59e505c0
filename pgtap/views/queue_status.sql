-- pgfence.queue_status: live tasks by state, and every task finished since the install, from
-- pgfence.queue_tallies: each finishing statement (complete, complete_many, report's complete
-- and final fail, requeue_expired's final fail) adds its count; fold_tallies sums a queue's
-- rows into one without changing a total; prune removes finished tasks, not their count.
begin;
select plan(12);
select pgfence_test.reset();

create temp table held on commit drop as select pgfence_test.lease('r', 'owner-r') as lease_id;
select pgfence.enqueue('q', jsonb_build_object('n', n), 1) from generate_series(1, 8) n;
create temp table c on commit drop as select * from pgfence.claim((select lease_id from held), 'q', 8);

-- complete (its own statement), complete_many (two at once), a retry (duplicate: no count).
select pgfence.complete(attempt_id) from c where task_id = 1;
select pgfence.complete_many(array(select attempt_id from c where task_id in (2, 3) order by task_id));
select pgfence.complete(attempt_id) from c where task_id = 1;
select results_eq($$ select completed, failed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (3::bigint, 0::bigint) $$,
                  'complete and complete_many count what they complete; a duplicate counts nothing');
select is((select count(*) from pgfence.queue_tallies where queue = 'q'), 2::bigint,
          'one tally row per finishing statement that finished something');

-- fail of a last attempt (report), requeue_expired failing one for good.
select pgfence.fail(attempt_id, '{"e": 1}') from c where task_id = 4;
select pgfence_test.expire_attempt(attempt_id) from c where task_id = 5;
select is(pgfence.requeue_expired(1), 1, 'requeue_expired fails the task whose one attempt ran out');
select results_eq($$ select completed, failed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (3::bigint, 2::bigint) $$,
                  'a final fail and a task failed for good by requeue_expired are counted failed');
select results_eq($$ select queued, claimed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (0::bigint, 3::bigint) $$,
                  'live tasks are counted from their rows');

-- The fold in requeue_expired left one row for the queue, its totals unchanged.
select is((select count(*) from pgfence.queue_tallies where queue = 'q'), 1::bigint,
          'requeue_expired folded the tallies into one row');
select results_eq($$ select completed, failed from pgfence.queue_tallies where queue = 'q' $$,
                  $$ values (3::bigint, 2::bigint) $$,
                  'the folded row holds the sums');

-- Folding again changes nothing; nor does a fold of several queues' rows.
select pgfence.complete_many(array(select attempt_id from c where task_id in (6, 7) order by task_id));
insert into pgfence.queue_tallies (queue, completed, failed) values ('other', 5, 1), ('other', 2, 0);
select pgfence.fold_tallies();
select pgfence.fold_tallies();
select results_eq($$ select queue, completed, failed from pgfence.queue_tallies order by queue $$,
                  $$ values ('other'::text, 7::bigint, 1::bigint), ('q', 5, 2) $$,
                  'folds sum each queue''s rows into one, whatever their number, and change no total');
select results_eq($$ select queue, queued, claimed, completed, failed from pgfence.queue_status order by queue $$,
                  $$ values ('other'::text, 0::bigint, 0::bigint, 7::bigint, 1::bigint), ('q', 0, 1, 5, 2) $$,
                  'a queue with only finished tasks is listed');

-- prune removes the finished tasks; their count stays.
update pgfence.tasks set finished_at = clock_timestamp() - interval '30 days' where state in ('completed', 'failed');
select results_eq($$ select rows from pgfence.prune('7 days') where what = 'tasks' $$, $$ values (7::bigint) $$,
                  'prune removes the finished tasks');
select results_eq($$ select completed, failed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (5::bigint, 2::bigint) $$,
                  'their count stays in queue_status');

select ok(not has_table_privilege('pgfence_monitor', 'pgfence.queue_tallies', 'select')
          and not has_function_privilege('pgfence_worker', 'pgfence.fold_tallies()', 'execute'),
          'the tallies and their fold are internal');

select * from finish();
rollback;

-- requeue_expired: tasks whose visibility ran out go back to their queue, or fail for good
-- after max_attempts; everything else is left alone; returns how many it handled, at most
-- max_tasks.
begin;
select plan(26);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;

-- Four claimed tasks, two of them overdue; one task never claimed, one completed, one failed.
select pgfence.enqueue('q', jsonb_build_object('job', n)) from generate_series(1, 4) n;
create temp table claimed on commit drop as
  select row_number() over (order by task_id) as n, c.*
    from pgfence.claim((select lease_id from held), 'q', 4, '1 minute') c;
select pgfence_test.expire_attempt(attempt_id) from claimed where n <= 2;
select pgfence.enqueue('done', '{}') from generate_series(1, 2);
create temp table done on commit drop as
  select row_number() over (order by task_id) as n, c.*
    from pgfence.claim((select lease_id from held), 'done', 2) c;
select pgfence.complete(attempt_id, '{"ok": true}') from done where n = 1;
select pgfence.fail(attempt_id, '{"error": "x"}') from done where n = 2;  -- max_attempts 3: queued for a retry
select pgfence.enqueue('idle', '{}');
create temp table before on commit drop as
  select task_id, state, attempt, pgfence.attempt_uuid(task_id, attempt, lease_id) as attempt_id, ready_at, visible_until, error, finished_at
    from pgfence.tasks;

select is((select overdue from pgfence.queue_status where queue = 'q'), 2::bigint, 'queue_status shows 2 overdue tasks');
select is(pgfence.requeue_expired(), 2, 'requeue_expired returns the number of overdue tasks it requeued');
select results_eq($$ select t.state, t.attempt, t.visible_until, t.error
                      from pgfence.tasks t join claimed c using (task_id) where c.n <= 2 order by t.task_id $$,
                  $$ values ('queued'::text, 1, null::timestamptz, null::jsonb), ('queued', 1, null, null) $$,
                  'the overdue tasks are queued again, attempt count kept, no error recorded');
select ok((select bool_and(t.ready_at <= clock_timestamp()) from pgfence.tasks t join claimed c using (task_id) where c.n <= 2),
          'and ready at once');
select results_eq($$ select t.task_id, t.state, t.attempt, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id), t.ready_at, t.visible_until, t.error, t.finished_at
                      from pgfence.tasks t
                     where t.task_id not in (select task_id from claimed where n <= 2) order by t.task_id $$,
                  $$ select * from before where task_id not in (select task_id from claimed where n <= 2) order by task_id $$,
                  'every other task (held within its visibility, completed, retried, never claimed) is untouched');
select results_eq($$ select queued, claimed, overdue from pgfence.queue_status where queue = 'q' $$,
                  $$ values (2::bigint, 2::bigint, 0::bigint) $$,
                  'queue_status shows 2 queued, 2 claimed, none overdue');
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 2::bigint,
          'the lease holds only the tasks within their visibility');
select is(pgfence.requeue_expired(), 0, 'a second run finds nothing to requeue');

-- The requeued tasks can be claimed again.
create temp table reclaimed on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q', 10);
select results_eq($$ select task_id, attempt from reclaimed order by task_id $$,
                  $$ select task_id, 2 from claimed where n <= 2 order by task_id $$,
                  'exactly the requeued tasks are claimed again, as attempt 2');

-- At max_attempts the task fails for good.
select pgfence.enqueue('m', '{"job": "m"}', 2);
create temp table m1 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'm');
select pgfence_test.expire_attempt(attempt_id) from m1;
select is(pgfence.requeue_expired(), 1, 'attempt 1 of 2 ran out: requeued');
select is((select t.state from pgfence.tasks t join m1 using (task_id)), 'queued', 'the task is queued again');
create temp table m2 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'm');
select is((select attempt from m2), 2, 'it is claimed as attempt 2');
select pgfence_test.expire_attempt(attempt_id) from m2;
select is(pgfence.requeue_expired(), 1, 'attempt 2 of 2 ran out: counted too');
select results_eq($$ select t.state, t.error ->> 'reason', t.visible_until from pgfence.tasks t join m2 using (task_id) $$,
                  $$ values ('failed'::text, 'visibility expired'::text, null::timestamptz) $$,
                  'at max_attempts the task fails for good with reason visibility expired');
select isnt((select t.finished_at from pgfence.tasks t join m2 using (task_id)), null, 'it has a finish time');
select pgfence_test.skip_backoff();
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'm') $$,
                'a task that failed for good is not claimed again');
select is((select failed from pgfence.queue_status where queue = 'm'), 1::bigint, 'queue_status counts it failed');

-- max_tasks limits how many one call handles.
select pgfence.enqueue('lim', '{}') from generate_series(1, 5);
create temp table lim on commit drop as
  select * from pgfence.claim((select lease_id from held), 'lim', 5);
select pgfence_test.expire_attempt(attempt_id) from lim;
select is(pgfence.requeue_expired(2), 2, 'requeue_expired(2) handles 2 of 5 overdue tasks');
select results_eq($$ select queued, overdue from pgfence.queue_status where queue = 'lim' $$,
                  $$ values (2::bigint, 3::bigint) $$,
                  'the other 3 are still overdue');

-- Bad max_tasks: 22023, nothing requeued.
select throws_ok($$ select pgfence.requeue_expired(0) $$, '22023', null, 'max_tasks 0 is refused');
select throws_ok($$ select pgfence.requeue_expired(-1) $$, '22023', null, 'a negative max_tasks is refused');
select throws_ok($$ select pgfence.requeue_expired(null) $$, '22023', null, 'a NULL max_tasks is refused');
select throws_ok($$ select pgfence.requeue_expired(100001) $$, '22023', null, 'max_tasks 100001 is refused');
select throws_like($$ select pgfence.requeue_expired(0) $$, '%max_tasks%', 'the error names the max_tasks argument');
select results_eq($$ select queued, overdue from pgfence.queue_status where queue = 'lim' $$,
                  $$ values (2::bigint, 3::bigint) $$,
                  'the refused calls requeued nothing');
select is(pgfence.requeue_expired(100000), 3, 'max_tasks 100000 is accepted and handles the rest');

select * from finish();
rollback;

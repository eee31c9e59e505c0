-- fail: with attempts left the task is queued again after a backoff, with its error stored;
-- after max_attempts it fails for good. The same acceptance rule as complete (I5): a retry is
-- a duplicate, a superseded attempt is stale and recorded, an unknown id is 22023.
begin;
select plan(38);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;

-- A fail with attempts left: queued again, after a backoff.
select pgfence.enqueue('q', '{"job": "q"}', 2);
create temp table a1 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q');
select is(pgfence.fail((select attempt_id from a1), '{"error": "boom"}'), 'accepted',
          'a fail with attempts left is accepted');
select results_eq($$ select t.state, t.error, t.result, t.finished_at from pgfence.tasks t join a1 using (task_id) $$,
                  $$ values ('queued'::text, '{"error": "boom"}'::jsonb, null::jsonb, null::timestamptz) $$,
                  'the task is queued again with the error stored and no finish time');
select ok((select t.ready_at > clock_timestamp() from pgfence.tasks t join a1 using (task_id)),
          'it is ready only after a backoff');
select ok((select t.visible_until is null from pgfence.tasks t join a1 using (task_id)), 'it is no longer held');
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 0::bigint,
          'the lease holds no task any more');
select results_eq($$ select queued, ready, claimed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (1::bigint, 0::bigint, 0::bigint) $$,
                  'queue_status shows it queued but not ready');
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'q') $$,
                'during its backoff it is not claimed');

-- Retries of the reported attempt are duplicates.
select is(pgfence.fail((select attempt_id from a1), '{"error": "boom"}'), 'duplicate',
          'a retried fail of the same attempt is a duplicate');
select is(pgfence.fail((select attempt_id from a1), '{"error": "other"}'), 'duplicate',
          'a fail of the same attempt with another error is a duplicate too');
select is(pgfence.complete((select attempt_id from a1), '{"answer": 1}'), 'duplicate',
          'a complete after the attempt failed is a duplicate');
select results_eq($$ select t.state, t.error, t.result, t.attempt from pgfence.tasks t join a1 using (task_id) $$,
                  $$ values ('queued'::text, '{"error": "boom"}'::jsonb, null::jsonb, 1) $$,
                  'the duplicates changed nothing');

-- After the backoff: attempt 2.
select pgfence_test.skip_backoff();
create temp table a2 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q');
select results_eq($$ select task_id, attempt, payload from a2 $$,
                  $$ select task_id, 2, payload from a1 $$,
                  'after the backoff the task is claimed again as attempt 2, with its payload');
select isnt((select attempt_id from a2), (select attempt_id from a1), 'with a new attempt_id');

-- The superseded attempt is stale now.
select is(pgfence.fail((select attempt_id from a1), '{"error": "late"}'), 'stale',
          'a fail from the superseded attempt is stale');
select results_eq($$ select s.attempt_id, s.attempt, s.kind, s.body from pgfence.stale_results s $$,
                  $$ select attempt_id, 1, 'fail'::text, '{"error": "late"}'::jsonb from a1 $$,
                  'and recorded in stale_results with kind fail and its body');
select results_eq($$ select t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id) from pgfence.tasks t join a2 using (task_id) $$,
                  $$ select 'claimed'::text, attempt_id from a2 $$,
                  'the task is still claimed by attempt 2');
select is(pgfence.fail((select attempt_id from a1), '{"error": "late"}'), 'stale', 'a retry is stale again');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'and adds no second row');

-- At max_attempts: failed for good.
select is(pgfence.fail((select attempt_id from a2), '{"error": "final"}'), 'accepted',
          'a fail at max_attempts is accepted');
select results_eq($$ select t.state, t.error from pgfence.tasks t join a2 using (task_id) $$,
                  $$ values ('failed'::text, '{"error": "final"}'::jsonb) $$,
                  'the task failed for good with the last error');
select isnt((select t.finished_at from pgfence.tasks t join a2 using (task_id)), null, 'it has a finish time');
select is(pgfence.fail((select attempt_id from a2), '{"error": "final"}'), 'duplicate',
          'a retried final fail is a duplicate');
select pgfence_test.skip_backoff();
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'q') $$,
                'a task that failed for good is not claimed again');
select results_eq($$ select queued, claimed, failed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (0::bigint, 0::bigint, 1::bigint) $$,
                  'queue_status counts it failed');

-- max_attempts 1: the first fail is final.
select pgfence.enqueue('once', '{"job": "once"}', 1);
create temp table once on commit drop as
  select * from pgfence.claim((select lease_id from held), 'once');
select is(pgfence.fail((select attempt_id from once)), 'accepted', 'a fail without an error is accepted');
select results_eq($$ select t.state, t.error from pgfence.tasks t join once using (task_id) $$,
                  $$ values ('failed'::text, null::jsonb) $$,
                  'with max_attempts 1 the first fail is final');

-- After the lease expired, before anyone claimed the task again: accepted.
create temp table expiring on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence.enqueue('b', '{"job": "b"}');
create temp table b on commit drop as
  select * from pgfence.claim((select lease_id from expiring), 'b');
select pgfence_test.expire(lease_id) from expiring;
select is(pgfence.fail((select attempt_id from b), '{"error": "late"}'), 'accepted',
          'a fail after the lease expired, before any new claim, is accepted');
select results_eq($$ select t.state, t.error from pgfence.tasks t join b using (task_id) $$,
                  $$ values ('queued'::text, '{"error": "late"}'::jsonb) $$,
                  'the task is queued for a retry with the error stored');

-- After the visibility ran out and the task was requeued, but not reclaimed: accepted.
select pgfence.enqueue('d', '{"job": "d"}');
create temp table d on commit drop as
  select * from pgfence.claim((select lease_id from held), 'd');
select pgfence_test.expire_attempt(attempt_id) from d;
select is(pgfence.requeue_expired(), 1, 'the overdue task is requeued');
select is(pgfence.fail((select attempt_id from d), '{"error": "slow"}'), 'accepted',
          'a fail from the requeued attempt is accepted while nobody reclaimed the task');
select ok((select t.state = 'queued' and t.error = '{"error": "slow"}' and t.ready_at > clock_timestamp()
             from pgfence.tasks t join d using (task_id)),
          'the task waits out its backoff with the error stored');

-- Ids that name no attempt: 22023, nothing changed.
select pgfence.enqueue('g', '{"job": "g"}');
create temp table g on commit drop as
  select * from pgfence.claim((select lease_id from held), 'g');
select throws_ok($$ select pgfence.fail(null) $$, '22023', null, 'a NULL attempt_id is refused');
select throws_ok(format('select pgfence.fail(%L)', gen_random_uuid()), '22023', null, 'a random uuid is refused');
select throws_ok(format('select pgfence.fail(%L)', pgfence.attempt_uuid(999999, 1, gen_random_uuid())), '22023', null,
                 'a well-formed attempt id of a task that does not exist is refused');
select throws_ok(format('select pgfence.fail(%L)', pgfence_test.forged_attempt((select task_id from g), 1)), '22023', null,
                 'an id with the current attempt number but a forged signature is refused');
select throws_ok(format('select pgfence.fail(%L)', pgfence.attempt_uuid((select task_id from g), 2, gen_random_uuid())), '22023', null,
                 'an id with a future attempt number is refused');
select results_eq($$ select t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id), t.error from pgfence.tasks t join g using (task_id) $$,
                  $$ select 'claimed'::text, attempt_id, null::jsonb from g $$,
                  'the refused ids left the task as it was');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'and recorded nothing as stale');

select * from finish();
rollback;

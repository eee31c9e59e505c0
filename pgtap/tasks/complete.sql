-- complete (I5): accepted from the attempt that holds the task, also after its lease expired
-- or was superseded and after its visibility ran out, as long as no newer attempt claimed the
-- task; a retry is a duplicate; a superseded attempt's result is stale and recorded in
-- pgfence.stale_results; an id pgfence did not mint is 22023.
begin;
select plan(44);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;

-- The attempt that holds the task completes it; a retry is a duplicate.
select pgfence.enqueue('a', '{"job": "a"}');
create temp table a on commit drop as
  select * from pgfence.claim((select lease_id from held), 'a');
select is(pgfence.complete((select attempt_id from a), '{"answer": 42}'), 'accepted',
          'the attempt that holds the task completes it');
select results_eq($$ select t.state, t.result from pgfence.tasks t join a using (task_id) $$,
                  $$ values ('completed'::text, '{"answer": 42}'::jsonb) $$,
                  'the task is completed with the result stored');
select ok((select t.finished_at is not null and t.visible_until is null from pgfence.tasks t join a using (task_id)),
          'the task has a finish time and is no longer held');
select is(pgfence.complete((select attempt_id from a), '{"answer": 42}'), 'duplicate',
          'a retried complete of the same attempt is a duplicate');
select is(pgfence.complete((select attempt_id from a), '{"answer": 43}'), 'duplicate',
          'a second complete with another result is a duplicate too');
select is(pgfence.fail((select attempt_id from a), '{"error": "late"}'), 'duplicate',
          'a fail after the attempt completed is a duplicate');
select results_eq($$ select t.state, t.result, t.error from pgfence.tasks t join a using (task_id) $$,
                  $$ values ('completed'::text, '{"answer": 42}'::jsonb, null::jsonb) $$,
                  'the duplicates changed nothing');
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 0::bigint,
          'a completed task is no longer held by the lease');
select is((select completed from pgfence.queue_status where queue = 'a'), 1::bigint, 'queue_status counts it completed');

-- After the lease expired, before anyone claimed the task again: accepted.
create temp table expiring on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence.enqueue('b', '{"job": "b"}');
create temp table b on commit drop as
  select * from pgfence.claim((select lease_id from expiring), 'b');
select pgfence_test.expire(lease_id) from expiring;
select is(pgfence.complete((select attempt_id from b), '{"late": "but valid"}'), 'accepted',
          'a result after the lease expired, before any new claim, is accepted');
select results_eq($$ select t.state, t.result from pgfence.tasks t join b using (task_id) $$,
                  $$ values ('completed'::text, '{"late": "but valid"}'::jsonb) $$,
                  'and its result is stored');

-- After the lease was superseded by a successor that did not reclaim the task: accepted.
create temp table predecessor on commit drop as
  select pgfence_test.lease('s', 'predecessor') as lease_id;
select pgfence.enqueue('c', '{"job": "c"}');
create temp table c on commit drop as
  select * from pgfence.claim((select lease_id from predecessor), 'c');
select pgfence_test.expire(lease_id) from predecessor;
select pgfence_test.lease('s', 'successor');
select is_empty($$ select * from pgfence.claim(pgfence_test.active_lease('s'), 'c') $$,
                'the successor finds nothing to claim: the attempt still holds the task');
select is((select status from pgfence.lease_status where resource = 's' and owner = 'predecessor'), 'superseded',
          'the lease the task was claimed under is superseded');
select is(pgfence.complete((select attempt_id from c), '{"from": "predecessor"}'), 'accepted',
          'a result from the superseded lease''s attempt that still holds the task is accepted');
select results_eq($$ select t.state, t.result from pgfence.tasks t join c using (task_id) $$,
                  $$ values ('completed'::text, '{"from": "predecessor"}'::jsonb) $$,
                  'and its result is stored');

-- After the visibility ran out and the task was requeued, but not reclaimed: accepted.
select pgfence.enqueue('d', '{"job": "d"}');
create temp table d on commit drop as
  select * from pgfence.claim((select lease_id from held), 'd');
select pgfence_test.expire_attempt(attempt_id) from d;
select is(pgfence.requeue_expired(), 1, 'the overdue task is requeued');
select is((select t.state from pgfence.tasks t join d using (task_id)), 'queued', 'the task is queued again');
select is(pgfence.complete((select attempt_id from d), '{"requeued": "but finished"}'), 'accepted',
          'a result from the requeued attempt is accepted while nobody reclaimed the task');
select results_eq($$ select t.state, t.result from pgfence.tasks t join d using (task_id) $$,
                  $$ values ('completed'::text, '{"requeued": "but finished"}'::jsonb) $$,
                  'the task is completed with that result');
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'd') $$,
                'the completed task is not claimed again');

-- After the task was reclaimed by a new attempt: the old attempt is stale.
select pgfence.enqueue('f', '{"job": "f"}');
create temp table f1 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'f');
select pgfence_test.expire_attempt(attempt_id) from f1;
select pgfence.requeue_expired();
create temp table f2 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'f');
select results_eq($$ select task_id, attempt from f2 $$, $$ select task_id, 2 from f1 $$,
                  'the task is reclaimed by attempt 2');
select is(pgfence.complete((select attempt_id from f1), '{"from": "attempt 1"}'), 'stale',
          'the superseded attempt''s result is stale');
select results_eq($$ select s.attempt_id, s.task_id, s.attempt, s.kind, s.body from pgfence.stale_results s $$,
                  $$ select attempt_id, task_id, 1, 'complete'::text, '{"from": "attempt 1"}'::jsonb from f1 $$,
                  'the stale result is recorded with its attempt, task, kind and body');
select results_eq($$ select t.state, t.attempt, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id), t.result from pgfence.tasks t join f2 using (task_id) $$,
                  $$ select 'claimed'::text, 2, attempt_id, null::jsonb from f2 $$,
                  'the task is unchanged: still claimed by the new attempt, no result');
select is(pgfence.complete((select attempt_id from f1), '{"from": "attempt 1"}'), 'stale',
          'a retry of the stale result is stale again');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'and adds no second row');
select is((select stale_results from pgfence.queue_status where queue = 'f'), 1::bigint,
          'queue_status counts the stale result');
select is(pgfence.complete((select attempt_id from f2), '{"from": "attempt 2"}'), 'accepted',
          'the new attempt''s result is accepted');
select results_eq($$ select t.state, t.result from pgfence.tasks t join f2 using (task_id) $$,
                  $$ values ('completed'::text, '{"from": "attempt 2"}'::jsonb) $$,
                  'the task is completed with the new attempt''s result');
select is(pgfence.complete((select attempt_id from f1), '{"from": "attempt 1"}'), 'stale',
          'after the new attempt completed, the old one is still stale');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'still one stale row');

-- Ids that name no attempt: 22023, nothing changed.
select pgfence.enqueue('g', '{"job": "g"}');
create temp table g on commit drop as
  select * from pgfence.claim((select lease_id from held), 'g');
select throws_ok($$ select pgfence.complete(null) $$, '22023', null, 'a NULL attempt_id is refused');
select throws_ok(format('select pgfence.complete(%L)', gen_random_uuid()), '22023', null,
                 'a random uuid is refused');
select throws_ok(format('select pgfence.complete(%L)', pgfence.attempt_uuid(999999, 1, gen_random_uuid())), '22023', null,
                 'a well-formed attempt id of a task that does not exist is refused');
select throws_ok(format('select pgfence.complete(%L)', pgfence_test.forged_attempt((select task_id from g), 1)), '22023', null,
                 'an id with the current attempt number but a forged signature is refused');
select throws_ok(format('select pgfence.complete(%L)', pgfence.attempt_uuid((select task_id from g), 2, gen_random_uuid())), '22023', null,
                 'an id with a future attempt number is refused');
select throws_ok(format('select pgfence.complete(%L)', pgfence_test.forged_attempt((select task_id from g), 0)), '22023', null,
                 'a forged id of an earlier attempt is refused, not recorded as stale');
select throws_like(format('select pgfence.complete(%L)', gen_random_uuid()), '%attempt_id%',
                   'the error names the attempt_id argument');
select results_eq($$ select t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id), t.result from pgfence.tasks t join g using (task_id) $$,
                  $$ select 'claimed'::text, attempt_id, null::jsonb from g $$,
                  'the refused ids left the task as it was');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'and recorded nothing as stale');
select is(pgfence.complete((select attempt_id from g)), 'accepted', 'the real attempt still completes, without a result');
select results_eq($$ select t.state, t.result from pgfence.tasks t join g using (task_id) $$,
                  $$ values ('completed'::text, null::jsonb) $$,
                  'a complete without a result stores NULL');

-- An id nobody minted, for a task nobody claimed yet (attempt number 0).
select pgfence.enqueue('h', '{"job": "h"}');
select throws_ok(format('select pgfence.complete(%L)', pgfence.attempt_uuid((select task_id from pgfence.tasks where queue = 'h'), 0, gen_random_uuid())),
                 '22023', null, 'an attempt id for a task that was never claimed is refused');
select results_eq($$ select state, attempt, result from pgfence.tasks where queue = 'h' $$,
                  $$ values ('queued'::text, 0, null::jsonb) $$,
                  'and the task stays queued, never attempted, without a result');

select * from finish();
rollback;

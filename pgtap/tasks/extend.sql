-- extend: the attempt that holds a task keeps it for visibility from now; NULL for an attempt
-- that no longer holds its task; 22023 for a bad visibility or an unknown attempt id.
begin;
select plan(28);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;

-- The current attempt extends its visibility.
select pgfence.enqueue('q', '{"job": "q"}');
create temp table a on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q', 1, '10 seconds');
create temp table extended on commit drop as
  select pgfence.extend((select attempt_id from a), '5 minutes') as visible_until;
select ok((select visible_until > clock_timestamp() + interval '4 minutes'
                  and visible_until <= clock_timestamp() + interval '5 minutes' from extended),
          'extend returns a time about visibility from now');
select is((select t.visible_until from pgfence.tasks t join a using (task_id)), (select visible_until from extended),
          'the task is held until the time returned');
select is((select t.state from pgfence.tasks t join a using (task_id)), 'claimed', 'the task stays claimed');
select ok(pgfence.extend((select attempt_id from a), '1 second') <= clock_timestamp() + interval '1 second',
          'visibility counts from now, so a shorter one brings the time forward');
select ok(pgfence.extend((select attempt_id from a), '1 day') > clock_timestamp() + interval '23 hours',
          'a one-day visibility is accepted');

-- An overdue attempt that extends in time keeps its task.
select pgfence_test.expire_attempt(attempt_id) from a;
select ok(pgfence.extend((select attempt_id from a), '1 minute') > clock_timestamp(),
          'an overdue attempt not yet requeued can still extend');
select is(pgfence.requeue_expired(), 0, 'then requeue_expired leaves its task alone');
select results_eq($$ select t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id) from pgfence.tasks t join a using (task_id) $$,
                  $$ select 'claimed'::text, attempt_id from a $$,
                  'the task is still held by the attempt');

-- A completed task's attempt: NULL.
select is(pgfence.complete((select attempt_id from a), '{"ok": true}'), 'accepted', 'the attempt completes');
select is(pgfence.extend((select attempt_id from a), '1 minute'), null, 'extending a completed task''s attempt returns NULL');
select is((select t.visible_until from pgfence.tasks t join a using (task_id)), null,
          'and does not hold the completed task again');

-- A failed (reported) attempt: NULL.
select pgfence.enqueue('fl', '{"job": "fl"}');
create temp table fl on commit drop as
  select * from pgfence.claim((select lease_id from held), 'fl');
select is(pgfence.fail((select attempt_id from fl)), 'accepted', 'the attempt fails');
select is(pgfence.extend((select attempt_id from fl), '1 minute'), null, 'extending a failed attempt returns NULL');

-- A requeued attempt that nobody reclaimed: NULL.
select pgfence.enqueue('rq', '{"job": "rq"}');
create temp table rq on commit drop as
  select * from pgfence.claim((select lease_id from held), 'rq');
select pgfence_test.expire_attempt(attempt_id) from rq;
select pgfence.requeue_expired();
select is(pgfence.extend((select attempt_id from rq), '1 minute'), null,
          'extending a requeued attempt returns NULL');
select results_eq($$ select t.state, t.visible_until from pgfence.tasks t join rq using (task_id) $$,
                  $$ values ('queued'::text, null::timestamptz) $$,
                  'the task stays queued, held by nobody');

-- A superseded attempt: NULL, and the new attempt's visibility is untouched.
create temp table rq2 on commit drop as
  select * from pgfence.claim((select lease_id from held), 'rq');
select is((select attempt from rq2), 2, 'the task is reclaimed by attempt 2');
create temp table rq2_until on commit drop as
  select t.visible_until from pgfence.tasks t join rq2 using (task_id);
select is(pgfence.extend((select attempt_id from rq), '1 day'), null, 'extending a superseded attempt returns NULL');
select is((select t.visible_until from pgfence.tasks t join rq2 using (task_id)), (select visible_until from rq2_until),
          'the new attempt''s visibility is unchanged');

-- Bad arguments: 22023, nothing changed.
select pgfence.enqueue('g', '{"job": "g"}');
create temp table g on commit drop as
  select * from pgfence.claim((select lease_id from held), 'g');
create temp table g_until on commit drop as
  select t.visible_until from pgfence.tasks t join g using (task_id);
select throws_ok(format('select pgfence.extend(%L, null)', (select attempt_id from g)), '22023', null,
                 'a NULL visibility is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', (select attempt_id from g), '0 seconds'), '22023', null,
                 'a zero visibility is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', (select attempt_id from g), '2 days'), '22023', null,
                 'a visibility of two days is refused');
select throws_like(format('select pgfence.extend(%L, %L)', (select attempt_id from g), '2 days'), '%visibility%',
                   'the error names the visibility argument');
select throws_ok($$ select pgfence.extend(null, '1 minute') $$, '22023', null, 'a NULL attempt_id is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', gen_random_uuid(), '1 minute'), '22023', null,
                 'a random uuid is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', pgfence.attempt_uuid(999999, 1, gen_random_uuid()), '1 minute'), '22023', null,
                 'a well-formed attempt id of a task that does not exist is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', pgfence_test.forged_attempt((select task_id from g), 1), '1 minute'),
                 '22023', null, 'an id with the current attempt number but a forged signature is refused');
select throws_ok(format('select pgfence.extend(%L, %L)', pgfence.attempt_uuid((select task_id from g), 2, gen_random_uuid()), '1 minute'),
                 '22023', null, 'an id with a future attempt number is refused');
select is((select t.visible_until from pgfence.tasks t join g using (task_id)), (select visible_until from g_until),
          'the refused calls left the task''s visibility as it was');

select * from finish();
rollback;

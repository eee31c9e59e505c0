-- prune: history older than the bound goes, in every kind; nothing live state needs goes,
-- however old: queued and claimed tasks, the leases they name (older attempts' too), the
-- active and draining leases, pending invocations, open windows, a task's stale results while
-- the task is unfinished. Bad bounds are 22023; PUBLIC and the worker cannot call it.
begin;
select plan(19);
select pgfence_test.reset();

-- Old history: resource r, leases g1 (superseded), g2 (released); a task finished under g2,
-- with a stale result; an expired invocation; a finished window; an unfenced write.
select pgfence.register('r'), pgfence.register('s');
create temp table l on commit drop as select 1 as n, pgfence_test.lease('r', 'one') as id;
select pgfence_test.expire(id) from l;
insert into l select 2, pgfence_test.lease('r', 'two');
select pgfence.enqueue('done', '{}');
create temp table a on commit drop as
  select c.attempt_id from pgfence.claim((select id from l where n = 2), 'done') c;
select pgfence.complete(attempt_id) from a;
select pgfence.release(id) from l where n = 2;
select pgfence.request_start('s', '1 second');
select pgfence.finish_update(pgfence.prepare_update(array['s'], gen_random_uuid()));
insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, report)
  select gen_random_uuid(), t.task_id, 0, 'complete', 1 from pgfence.tasks t;
insert into pgfence.unfenced_writes (table_name, resource, operation, mode, transaction_id, role_name)
  values ('t', 'r', 'INSERT', 'observe', pg_current_xact_id(), current_user);

-- Live state, made as old as the history: lease g3 active on r, claimed under it a task
-- first claimed under a lease g4 of q's other resource, since superseded; a queued task; a
-- draining lease; a pending invocation; an open window; a stale result of the claimed task.
create temp table live on commit drop as select 1 as n, pgfence_test.lease('q', 'older') as id;
select pgfence.enqueue('work', '{}'), pgfence.enqueue('waiting', '{}');
select pgfence.claim((select id from live), 'work', 1, '1 second');
select pgfence_test.expire(id) from live;
insert into live select 2, pgfence_test.lease('q', 'newer');   -- supersedes 'older'
select pgfence_test.expire_attempt(pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id))
  from pgfence.tasks t where t.queue = 'work';
select pgfence.requeue_expired();
select pgfence.claim((select id from live where n = 2), 'work', 1, '1 hour');
select pgfence.register('d');
insert into live select 3, pgfence_test.lease('d', 'draining');
select pgfence.drain(id) from live where n = 3;
select pgfence.register('p');
select pgfence.request_start('p', '1 day');
select pgfence.register('w');
select pgfence.prepare_update(array['w'], gen_random_uuid());
insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, report)
  select gen_random_uuid(), t.task_id, 0, 'complete', 1 from pgfence.tasks t where t.queue = 'work';

-- Everything ten days old (the pending invocation still unexpired: it expires in a day).
update pgfence.leases set acquired_at = acquired_at - interval '10 days',
                          ended_at = ended_at - interval '10 days',
                          expires_at = case when state = 'active' then expires_at else expires_at - interval '10 days' end;
update pgfence.tasks set enqueued_at = enqueued_at - interval '10 days', finished_at = finished_at - interval '10 days';
update pgfence.invocations set requested_at = requested_at - interval '10 days',
                               expires_at = case when resource = 's' then expires_at - interval '10 days' else expires_at end;
update pgfence.updates set prepared_at = prepared_at - interval '10 days', finished_at = finished_at - interval '10 days';
update pgfence.stale_results set received_at = received_at - interval '10 days';
update pgfence.unfenced_writes set at = at - interval '10 days';

create temp table kept on commit drop as
  select (select array_agg(lease_id order by generation) from pgfence.leases l where l.owner in ('older', 'newer', 'draining')) as leases,
         (select array_agg(task_id order by task_id) from pgfence.tasks where queue in ('work', 'waiting')) as tasks;

select results_eq($$ select what, rows from pgfence.prune('7 days') $$,
  $$ values ('tasks', 1::bigint), ('stale_results', 1), ('leases', 2), ('invocations', 1), ('updates', 1),
            ('unfenced_writes', 1) $$,
  'prune removes one row of each kind of old history, the core''s kinds in this order');
select is((select count(*) from pgfence.leases where owner in ('one', 'two')), 0::bigint, 'the ended leases are gone');
select is((select array_agg(lease_id order by generation) from pgfence.leases l where l.owner in ('older', 'newer', 'draining')),
          (select leases from kept), 'the active and draining leases stay, and the superseded one a claimed task''s older attempt names');
select is((select array_agg(task_id order by task_id) from pgfence.tasks), (select tasks from kept),
          'the claimed and the queued task stay; the completed one is gone');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'the claimed task''s stale result stays (it counts toward its bound)');
select is((select count(*) from pgfence.invocations where resource = 'p'), 1::bigint, 'the pending invocation stays');
select is((select count(*) from pgfence.invocations), 1::bigint, 'the expired one is gone');
select is((select count(*) from pgfence.updates where finished_at is null), 1::bigint, 'the open window stays');
select is((select count(*) from pgfence.update_items i join pgfence.updates u using (token) where u.finished_at is null), 1::bigint,
          'with its items');
select is((select count(*) from pgfence.unfenced_writes), 0::bigint, 'the unfenced write record is gone');
select results_eq($$ select what, rows from pgfence.prune('7 days') $$,
  $$ values ('tasks', 0::bigint), ('stale_results', 0), ('leases', 0), ('invocations', 0), ('updates', 0),
            ('unfenced_writes', 0) $$, 'a second run finds nothing');
select is((select count(*) from pgfence.prune('11 days') where rows > 0), 0::bigint, 'a longer bound keeps what is younger');
select isnt((select (pgfence.acquire('p', 'after', '1 minute', i.invocation_id)).lease_id from pgfence.invocations i where i.resource = 'p'),
            null, 'the pending invocation still starts its worker');

select throws_ok($$ select * from pgfence.prune('59 minutes') $$, '22023', null, 'a bound under 1 hour is refused');
select throws_ok($$ select * from pgfence.prune(null) $$, '22023', null, 'NULL is refused');
select throws_ok($$ select * from pgfence.prune('11 years') $$, '22023', null, 'more than 10 years is refused');
select ok(has_function_privilege('pgfence_operator', 'pgfence.prune(interval)', 'execute'), 'the operator may prune');
select ok(not has_function_privilege('pgfence_worker', 'pgfence.prune(interval)', 'execute'), 'a worker may not');
select ok(not has_function_privilege('public', 'pgfence.prune(interval)', 'execute'), 'PUBLIC may not');

select * from finish();
rollback;

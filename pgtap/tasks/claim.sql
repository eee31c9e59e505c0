-- claim: under a current lease, takes up to qty ready tasks of one queue and mints an attempt
-- for each; refuses a lease that is not current (PF001) and bad arguments (22023), claiming
-- nothing.
begin;
select plan(46);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;
create temp table queued on commit drop as
  select pgfence.enqueue('q', jsonb_build_object('job', n)) as task_id, n
    from generate_series(1, 5) n;
create temp table other_queue on commit drop as
  select pgfence.enqueue('other', '{"job": "other"}') as task_id;

-- The first claim gets qty tasks, each with its own attempt.
create temp table first_claim on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q', 3);
select is((select count(*) from first_claim), 3::bigint, 'a claim of 3 gets 3 tasks');
select is((select count(distinct attempt_id) from first_claim), 3::bigint, 'each claimed task has its own attempt_id');
select ok((select bool_and(attempt_id is not null) from first_claim), 'no attempt_id is NULL');
select ok((select bool_and(attempt = 1) from first_claim), 'a first claim is attempt 1');
select is_empty($$ select c.task_id from first_claim c left join queued q using (task_id)
                    where q.task_id is null or c.payload <> jsonb_build_object('job', q.n) $$,
                'the claimed tasks are tasks of queue q, each with its own payload');
select results_eq($$ select t.task_id, t.state, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id) from pgfence.tasks t join first_claim c using (task_id)
                      order by t.task_id $$,
                  $$ select task_id, 'claimed'::text, attempt_id from first_claim order by task_id $$,
                  'the claimed tasks are in state claimed, held by the attempts returned');
select ok((select bool_and(t.visible_until > clock_timestamp() + interval '25 seconds'
                           and t.visible_until <= clock_timestamp() + interval '30 seconds')
             from pgfence.tasks t join first_claim c using (task_id)),
          'by default a claimed task is held for about 30 seconds');

-- The views count what the lease holds.
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 3::bigint,
          'lease_status.tasks_held counts the tasks the lease claimed');
select is((select claimed_tasks from pgfence.resource_status where resource = 'r'), 3::bigint,
          'resource_status.claimed_tasks counts them too');
select results_eq($$ select queued, claimed from pgfence.queue_status where queue = 'q' $$,
                  $$ values (2::bigint, 3::bigint) $$,
                  'queue_status shows 2 queued and 3 claimed in q');

-- A second claim gets the rest, then there is nothing left.
create temp table second_claim on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q', 10, '5 minutes');
select is((select count(*) from second_claim), 2::bigint, 'a second claim of 10 gets the 2 tasks left');
select is_empty($$ select task_id from second_claim intersect select task_id from first_claim $$,
                'no task is claimed twice');
select ok((select bool_and(t.visible_until > clock_timestamp() + interval '4 minutes'
                           and t.visible_until <= clock_timestamp() + interval '5 minutes')
             from pgfence.tasks t join second_claim c using (task_id)),
          'a claim holds its tasks for the visibility asked for');
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'q', 10) $$,
                'a third claim gets nothing');
select is((select tasks_held from pgfence.lease_status where resource = 'r'), 5::bigint,
          'lease_status.tasks_held counts all 5');
select is((select claimed_tasks from pgfence.resource_status where resource = 'r'), 5::bigint,
          'resource_status.claimed_tasks counts all 5');

-- Only the named queue.
select results_eq($$ select t.state from pgfence.tasks t join other_queue o using (task_id) $$,
                  $$ values ('queued'::text) $$,
                  'the task of another queue was not claimed');

-- A task waiting out its backoff is not claimed.
select pgfence.enqueue('later', '{"job": "later"}');
create temp table later on commit drop as
  select * from pgfence.claim((select lease_id from held), 'later', 1);
select is(pgfence.fail((select attempt_id from later), '{"error": "boom"}'), 'accepted', 'the later task fails once');
select ok((select ready_at > clock_timestamp() from pgfence.tasks where queue = 'later'),
          'the failed task is ready only later');
select is_empty($$ select * from pgfence.claim((select lease_id from held), 'later', 1) $$,
                'a task not yet ready is not claimed');
select is((select state from pgfence.tasks where queue = 'later'), 'queued', 'it stays queued');

-- Leases that are not current claim nothing: PF001.
select pgfence.enqueue('fresh', jsonb_build_object('job', n)) from generate_series(1, 2) n;
create temp table claimed_before on commit drop as
  select count(*) as n from pgfence.tasks where state = 'claimed';

create temp table expired on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence_test.expire(lease_id) from expired;
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from expired), 'fresh'),
                 'PF001', null, 'an expired lease cannot claim');

select throws_ok(format('select * from pgfence.claim(%L, %L)', pgfence_test.superseded_lease('s'), 'fresh'),
                 'PF001', null, 'a superseded lease cannot claim');

create temp table draining on commit drop as
  select pgfence_test.lease('d', 'owner-d') as lease_id;
select pgfence.drain(lease_id) from draining;
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from draining), 'fresh'),
                 'PF001', null, 'a draining lease cannot claim');

create temp table released on commit drop as
  select pgfence_test.lease('x', 'owner-x') as lease_id;
select pgfence.release(lease_id) from released;
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from released), 'fresh'),
                 'PF001', null, 'a released lease cannot claim');

select throws_ok(format('select * from pgfence.claim(%L, %L)', gen_random_uuid(), 'fresh'),
                 'PF001', null, 'an unknown lease cannot claim');

-- Bad arguments: 22023.
select throws_ok($$ select * from pgfence.claim(null, 'fresh') $$, '22023', null, 'a NULL lease_id is refused');
select throws_ok(format('select * from pgfence.claim(%L, null)', (select lease_id from held)), '22023', null,
                 'a NULL queue is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from held), ''), '22023', null,
                 'an empty queue is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from held), 'has space'), '22023', null,
                 'a queue name with a space is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, 0)', (select lease_id from held), 'fresh'), '22023', null,
                 'qty 0 is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, 1001)', (select lease_id from held), 'fresh'), '22023', null,
                 'qty 1001 is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, null)', (select lease_id from held), 'fresh'), '22023', null,
                 'a NULL qty is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, 1, %L)', (select lease_id from held), 'fresh', '0 seconds'),
                 '22023', null, 'a zero visibility is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, 1, %L)', (select lease_id from held), 'fresh', '2 days'),
                 '22023', null, 'a visibility of two days is refused');
select throws_ok(format('select * from pgfence.claim(%L, %L, 1, null)', (select lease_id from held), 'fresh'),
                 '22023', null, 'a NULL visibility is refused');
select throws_like(format('select * from pgfence.claim(%L, %L, 0)', (select lease_id from held), 'fresh'),
                   '%qty%', 'the error names the qty argument');
select throws_like(format('select * from pgfence.claim(%L, %L, 1, %L)', (select lease_id from held), 'fresh', '2 days'),
                   '%visibility%', 'the error names the visibility argument');

-- Refused claims changed nothing.
select is((select count(*) from pgfence.tasks where state = 'claimed'), (select n from claimed_before),
          'no refused claim claimed a task');
select results_eq($$ select queued, ready, claimed from pgfence.queue_status where queue = 'fresh' $$,
                  $$ values (2::bigint, 2::bigint, 0::bigint) $$,
                  'the tasks of queue fresh are still queued and ready');
select is((select sum(tasks_held) from pgfence.lease_status where resource in ('e', 's', 'd', 'x')), 0::numeric,
          'the refused leases hold no task');

-- The successor of the superseded lease may claim; the views count per lease and resource.
create temp table successor_claim on commit drop as
  select * from pgfence.claim(pgfence_test.active_lease('s'), 'fresh', 1);
select is((select count(*) from successor_claim), 1::bigint, 'the successor of the superseded lease claims');
select results_eq($$ select owner, tasks_held from pgfence.lease_status where resource = 's' order by generation $$,
                  $$ values ('predecessor'::text, 0::bigint), ('successor', 1) $$,
                  'lease_status counts the task for the lease that claimed it, not its predecessor');
select is((select claimed_tasks from pgfence.resource_status where resource = 's'), 1::bigint,
          'resource_status.claimed_tasks counts it for its resource');
select is((select claimed_tasks from pgfence.resource_status where resource = 'r'), 5::bigint,
          'and not for another resource');

-- The edges of what is allowed.
select is((select count(*) from pgfence.claim((select lease_id from held), 'fresh', 1000, '1 day')), 1::bigint,
          'qty 1000 and a one-day visibility are accepted');

select * from finish();
rollback;

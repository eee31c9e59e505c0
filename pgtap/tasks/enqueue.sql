-- enqueue: adds a queued task and returns its id; refuses a bad queue name, a NULL payload and
-- max_attempts outside 1..1000, adding nothing.
begin;
select plan(20);
select pgfence_test.reset();

create temp table enqueued on commit drop as
  select 1 as n, pgfence.enqueue('q', '{"job": 1}') as task_id;
insert into enqueued select 2, pgfence.enqueue('q', '{"job": 2}', 5);
insert into enqueued select 3, pgfence.enqueue('other.queue:v1', '[1, 2, 3]', 1);
insert into enqueued select 4, pgfence.enqueue('q');

select isnt((select task_id from enqueued where n = 1), null, 'enqueue returns a task id');
select ok((select bool_and(task_id > prev)
             from (select task_id, lag(task_id) over (order by n) as prev from enqueued) s
            where prev is not null),
          'each enqueue returns a greater task id than the one before');
select is((select count(distinct task_id) from enqueued), 4::bigint, 'every task gets its own id');

-- The task is queued, with what was given.
select results_eq($$ select t.queue, t.state, t.payload, t.max_attempts, t.attempt
                      from pgfence.tasks t join enqueued e using (task_id) where e.n = 2 $$,
                  $$ values ('q'::text, 'queued'::text, '{"job": 2}'::jsonb, 5, 0) $$,
                  'the task is queued in its queue with its payload and max_attempts, not yet attempted');
select results_eq($$ select t.payload, t.max_attempts
                      from pgfence.tasks t join enqueued e using (task_id) where e.n = 4 $$,
                  $$ values ('{}'::jsonb, 3) $$,
                  'by default the payload is {} and max_attempts is 3');
select ok((select t.ready_at <= clock_timestamp() from pgfence.tasks t join enqueued e using (task_id) where e.n = 1),
          'a new task is ready at once');

-- queue_status shows it.
select results_eq($$ select queue, queued, ready, claimed, completed, failed
                      from pgfence.queue_status order by queue $$,
                  $$ values ('other.queue:v1'::text, 1::bigint, 1::bigint, 0::bigint, 0::bigint, 0::bigint),
                            ('q', 3, 3, 0, 0, 0) $$,
                  'queue_status shows the tasks queued and ready in their queues');

-- Bad arguments: 22023, nothing added.
select throws_ok($$ select pgfence.enqueue(null, '{}') $$, '22023', null, 'a NULL queue is refused');
select throws_ok($$ select pgfence.enqueue('', '{}') $$, '22023', null, 'an empty queue is refused');
select throws_ok($$ select pgfence.enqueue('has space', '{}') $$, '22023', null, 'a queue name with a space is refused');
select throws_ok($$ select pgfence.enqueue('-q', '{}') $$, '22023', null, 'a queue name starting with punctuation is refused');
select throws_ok(format('select pgfence.enqueue(%L, %L)', repeat('q', 129), '{}'), '22023', null,
                 'a 129-character queue name is refused');
select throws_ok($$ select pgfence.enqueue('q', null) $$, '22023', null, 'a NULL payload is refused');
select throws_ok($$ select pgfence.enqueue('q', '{}', 0) $$, '22023', null, 'max_attempts 0 is refused');
select throws_ok($$ select pgfence.enqueue('q', '{}', -1) $$, '22023', null, 'a negative max_attempts is refused');
select throws_ok($$ select pgfence.enqueue('q', '{}', 1001) $$, '22023', null, 'max_attempts 1001 is refused');
select throws_ok($$ select pgfence.enqueue('q', '{}', null) $$, '22023', null, 'a NULL max_attempts is refused');
select throws_like($$ select pgfence.enqueue('q', '{}', 0) $$, '%max_attempts%', 'the error names the max_attempts argument');
select is((select count(*) from pgfence.tasks), 4::bigint, 'no refused enqueue added a task');

-- The edges of what is allowed.
select isnt(pgfence.enqueue(repeat('q', 128), 'null'::jsonb, 1000), null,
            'a 128-character queue name, a JSON null payload and max_attempts 1000 are accepted');

select * from finish();
rollback;

-- pgfence.counters: per resource, the generation, lease state and age, takeovers, stale
-- results, unfenced writes, the queues its leases claimed from with their depth and the age
-- of the oldest ready task; no column of type uuid (no capability); the monitor reads it.
begin;
select plan(12);
select pgfence_test.reset();

-- r: taken over once (generation 2), a stale result of its first lease's attempt, three tasks
-- claimed and two queued in q; s: never leased; an unfenced write recorded for r.
create temp table a on commit drop as
  select pgfence_test.lease('r', 'first') as lease_id;
select pgfence.enqueue('q', '{}') from generate_series(1, 3);
create temp table c on commit drop as
  select * from pgfence.claim((select lease_id from a), 'q', 1, '1 minute');
select pgfence_test.expire(lease_id) from a;
select pgfence_test.expire_attempt(attempt_id) from c;
select pgfence_test.lease('r', 'second');
select pgfence.requeue_expired();
select pgfence.claim((select lease_id from pgfence.leases where owner = 'second'), 'q', 3, '1 minute');
select pgfence.complete(attempt_id) from c;   -- stale: a newer attempt holds it
select pgfence.enqueue('q', '{}') from generate_series(1, 2);
select pgfence.register('s');
insert into pgfence.unfenced_writes (table_name, resource, operation, mode, transaction_id, role_name)
  values ('t', 'r', 'INSERT', 'observe', pg_current_xact_id(), current_user);
update pgfence.tasks set ready_at = clock_timestamp() - interval '1 hour' where state = 'queued';

select results_eq($$ select resource, generation, lease_state, takeovers, stale_results, unfenced_writes,
                            queues, queue_depth from pgfence.counters order by resource $$,
  $$ values ('r'::text, (select generation from pgfence.leases where owner = 'second'), 'current'::text,
             1::bigint, 1::bigint, 1::bigint, array['q'], 2::bigint),
            ('s', null, 'none', 0, 0, 0, null, 0) $$,
  'per resource: generation, lease state, takeovers, stale results, unfenced writes, queues and their depth');
-- A resource's queues are those a claim of its leases took tasks from (claim records them): a
-- claim that found nothing adds none, and they stay when prune removes the tasks.
select pgfence.enqueue('b', '{}');
select pgfence.claim((select lease_id from pgfence.leases where owner = 'second'), 'b', 1, '1 minute');
select pgfence.claim((select lease_id from pgfence.leases where owner = 'second'), 'empty', 1, '1 minute');
select is((select queues from pgfence.counters where resource = 'r'), array['b', 'q'],
          'both queues its leases claimed from, in order; not the one where nothing was claimed');
select is((select queue_depth from pgfence.counters where resource = 'r'), 2::bigint,
          'the depth of its queues together');
delete from pgfence.tasks where queue = 'b';
select is((select queues from pgfence.counters where resource = 'r'), array['b', 'q'],
          'a queue stays the resource''s when its tasks are gone');
select ok((select oldest_ready_age >= interval '1 hour' from pgfence.counters where resource = 'r'),
          'the oldest ready task''s age');
select ok((select lease_age between interval '0' and interval '1 minute' from pgfence.counters where resource = 'r'),
          'the current lease''s age');
select is((select oldest_ready_age from pgfence.counters where resource = 's'), null, 'no queue, no age');
select is((select count(*) from pg_attribute where attrelid = 'pgfence.counters'::regclass
             and atttypid = 'uuid'::regtype), 0::bigint, 'no uuid column: no capability');
select ok(has_table_privilege('pgfence_monitor', 'pgfence.counters', 'select'), 'the monitor reads it');
select ok(has_table_privilege('pgfence_operator', 'pgfence.counters', 'select'), 'the operator too');
select ok(not has_table_privilege('pgfence_worker', 'pgfence.counters', 'select'), 'not the worker');
select ok(not has_table_privilege('public', 'pgfence.counters', 'select'), 'not PUBLIC');

select * from finish();
rollback;

-- The pgmq layer (schema pgfence_pgmq): read under a current lease only; attempt ids per read;
-- archive / delete accepted while the message was not read again (and is the same message),
-- duplicate for a retry, stale (recorded in pgfence_pgmq.stale_results) otherwise; set_vt;
-- every pgmq queue name works; every bad argument 22023, nothing changed.
begin;
select plan(57);
select pgfence_test.reset();

select pgmq.create('jobs');
select pgmq.create('other');
select pgmq.send('jobs', jsonb_build_object('n', n)) from generate_series(1, 3) n;
create temp table held on commit drop as select pgfence_test.lease('r', 'owner-r') as lease_id;
create temp table old on commit drop as select pgfence_test.superseded_lease('s') as lease_id;

-- Bad arguments change nothing.
select throws_ok($$ select * from pgfence_pgmq.read(null, 'jobs', '30 s') $$, '22023', null, 'pgmq_read: NULL lease_id');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), null, '30 s') $$, '22023', null, 'NULL queue');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'nosuch', '30 s') $$, '22023',
                 'pgfence: invalid argument queue: no such pgmq queue', 'an unknown queue');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs; drop table x', '30 s') $$, '22023',
                 'pgfence: invalid argument queue: must be a pgmq queue name: 1 to 47 characters, none of $ ; -- or ''',
                 'a hostile queue name');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs'' or ''1', '30 s') $$, '22023', null,
                 'a quote in a queue name');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), repeat('q', 48), '30 s') $$, '22023', null,
                 'a queue name longer than pgmq allows');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', null) $$, '22023', null, 'NULL vt');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '0 s') $$, '22023', null, 'vt 0');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '-1 s') $$, '22023', null, 'a negative vt');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '25 hours') $$, '22023', null, 'vt over a day');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '1 month') $$, '22023', null, 'vt in months');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', null) $$, '22023', null, 'NULL qty');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', 0) $$, '22023', null, 'qty 0');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', 1001) $$, '22023', null, 'qty 1001');
select is((select sum(read_ct)::int from pgmq.q_jobs), 0, 'no bad call read anything');

-- Only under the current lease.
select throws_ok($$ select * from pgfence_pgmq.read(gen_random_uuid(), 'jobs', '30 s') $$, 'PF001', null, 'an unknown lease');
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from old), 'jobs', '30 s') $$, 'PF001', null, 'a superseded lease');
create temp table drained on commit drop as select pgfence_test.lease('d', 'owner-d') as lease_id;
select pgfence.drain(lease_id) from drained;
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from drained), 'jobs', '30 s') $$, 'PF001', null, 'a draining lease');
create temp table expired on commit drop as select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence_test.expire(lease_id) from expired;
select throws_ok($$ select * from pgfence_pgmq.read((select lease_id from expired), 'jobs', '30 s') $$, 'PF001', null,
                 'an expired lease nobody superseded yet');

-- A read.
create temp table got on commit drop as select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', 2);
select results_eq($$ select msg_id, read_ct, message from got order by msg_id $$,
                  $$ values (1::bigint, 1, '{"n": 1}'::jsonb), (2::bigint, 1, '{"n": 2}'::jsonb) $$,
                  'the oldest visible messages, read once');
select ok((select bool_and(enqueued_at is not null) from got), 'with their enqueued_at');
select ok((select bool_and(q.vt > clock_timestamp() + interval '29 seconds') from pgmq.q_jobs q join got using (msg_id)),
          'invisible for vt');
select is((select count(distinct attempt_id)::int from got), 2, 'an attempt id per message');
select ok((select bool_and(substr(attempt_id::text, 20, 1) = 'a' and left(replace(attempt_id::text, '-', ''), 12) = lpad(to_hex(msg_id), 12, '0'))
             from got), 'attempt ids name their message and the pgmq scheme');
select results_eq($$ select a.queue, a.msg_id, a.read_ct, a.lease_id from pgfence_pgmq.attempts a join got g using (attempt_id) order by 2 $$,
                  $$ select 'jobs'::text, g.msg_id, 1, (select lease_id from held) from got g order by 2 $$,
                  'and are recorded with their queue, message, read count and lease');
select is((select count(*)::int from pgfence_pgmq.read((select lease_id from held), 'other', '30 s', 5)), 0,
          'an empty queue reads nothing');
select is((select count(*)::int from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', 5)), 1,
          'messages being handled are not read again');

-- Results.
select throws_ok($$ select pgfence_pgmq.archive(null) $$, '22023', null, 'pgmq_archive: NULL attempt_id');
select throws_ok($$ select pgfence_pgmq.archive(gen_random_uuid()) $$, '22023',
                 'pgfence: invalid argument attempt_id: is not an attempt id minted by pgfence_pgmq.read', 'an unknown attempt id');
select throws_ok(format('select pgfence_pgmq.delete(%L)',
                        overlay(a::text placing case when right(a::text, 1) = '0' then '1' else '0' end from 36 for 1)),
                 '22023', null, 'a forged attempt id')
  from (select attempt_id a from got where msg_id = 1) x;
select pgfence.enqueue('tasks', '{}');
select throws_ok(format('select pgfence_pgmq.archive(%L)', attempt_id), '22023', null, 'a task''s attempt id is foreign here')
  from pgfence.claim((select lease_id from held), 'tasks');
select throws_ok($$ select pgfence_pgmq.set_vt(null, '1 minute') $$, '22023', null, 'pgmq_set_vt: NULL attempt_id');
select throws_ok(format('select pgfence_pgmq.set_vt(%L, null)', attempt_id), '22023', null, 'pgmq_set_vt: NULL vt')
  from got where msg_id = 1;
select throws_ok(format('select pgfence_pgmq.set_vt(%L, ''2 days'')', attempt_id), '22023', null, 'pgmq_set_vt: vt over a day')
  from got where msg_id = 1;
select ok(pgfence_pgmq.set_vt(attempt_id, '10 minutes') > clock_timestamp() + interval '9 minutes', 'set_vt keeps the message')
  from got where msg_id = 1;
select is(pgfence_pgmq.archive(attempt_id), 'accepted', 'the reader archives its message') from got where msg_id = 1;
select is(pgfence_pgmq.archive(attempt_id), 'duplicate', 'a retry is a duplicate') from got where msg_id = 1;
select is(pgfence_pgmq.delete(attempt_id), 'duplicate', 'so is a delete after the archive') from got where msg_id = 1;
select is(pgfence_pgmq.set_vt(attempt_id, '1 minute'), null, 'set_vt of a finished attempt: NULL') from got where msg_id = 1;
select results_eq($$ select msg_id, read_ct from pgmq.a_jobs $$, $$ values (1::bigint, 1) $$, 'message 1 is in the archive');

-- Message 2 read again by a successor: the first attempt is stale.
select pgfence_test.expire(lease_id) from held;
create temp table next on commit drop as select pgfence_test.lease('r', 'successor') as lease_id;
select pgfence_test.expire_message('jobs', 2);
create temp table again on commit drop as select * from pgfence_pgmq.read((select lease_id from next), 'jobs', '30 s', 1);
select results_eq($$ select msg_id, read_ct from again $$, $$ values (2::bigint, 2) $$, 'the successor reads message 2 again');
select is(pgfence_pgmq.delete(attempt_id), 'stale', 'the first attempt''s delete is stale') from got where msg_id = 2;
select is(pgfence_pgmq.delete(attempt_id), 'stale', 'and stays stale') from got where msg_id = 2;
select is(pgfence_pgmq.archive(attempt_id), 'stale', 'its archive too') from got where msg_id = 2;
select is(pgfence_pgmq.set_vt(attempt_id, '1 minute'), null, 'its set_vt: NULL') from got where msg_id = 2;
select results_eq($$ select msg_id, read_ct, kind, queue, report from pgfence_pgmq.stale_results order by report $$,
                  $$ values (2::bigint, 1, 'delete', 'jobs', 1), (2::bigint, 1, 'archive', 'jobs', 2) $$,
                  'recorded once per kind in the layer''s stale_results, naming queue, message and read count');
select is((select read_ct from pgmq.q_jobs where msg_id = 2), 2, 'the successor''s message is untouched');
select is((select count(*)::int from pgfence.stale_results), 0, 'the core''s stale_results holds none of the layer''s');
select is(pgfence_pgmq.delete(attempt_id), 'accepted', 'the successor deletes it') from again;

-- A producer inserts a message again under an old msg_id: a new message (read_ct from 0), not
-- the one the old attempt read, whose delete stays stale when the new one is read to the same
-- read count.
select pgmq.send('jobs', '{"n": 4}');
create temp table third on commit drop as select * from pgfence_pgmq.read((select lease_id from next), 'jobs', '30 s', 1);
select results_eq($$ select msg_id, read_ct from third $$, $$ values (4::bigint, 1) $$, 'message 4 read once');
delete from pgmq.q_jobs where msg_id = 4;
insert into pgmq.q_jobs (msg_id, read_ct, enqueued_at, vt, message) overriding system value
values (4, 0, clock_timestamp(), clock_timestamp(), '{"n": "again"}');  -- (now() is the read's: one transaction)
create temp table third_again on commit drop as
  select * from pgfence_pgmq.read((select lease_id from next), 'jobs', '30 s', 1);
select results_eq($$ select msg_id, read_ct from third_again $$, $$ values (4::bigint, 1) $$,
                  'the re-inserted message 4 read once: the same msg_id and read count');
select is(pgfence_pgmq.delete(attempt_id), 'stale', 'the first read''s delete is stale: another message') from third;
select is((select message from pgmq.q_jobs where msg_id = 4), '{"n": "again"}'::jsonb, 'which is untouched');

-- Every name pgmq accepts.
select pgmq.create('queue-hyphened');
select pgmq.send('queue-hyphened', '{"h": 1}');
select is(pgfence_pgmq.archive(attempt_id), 'accepted', 'a hyphenated queue is read and archived')
  from pgfence_pgmq.read((select lease_id from next), 'queue-hyphened', '30 s', 1);

-- Privileges.
select ok(has_function_privilege('pgfence_worker', f, 'execute'), 'pgfence_worker may call ' || f)
  from unnest(array['pgfence_pgmq.read(uuid, text, interval, int)', 'pgfence_pgmq.archive(uuid)']) f;
select throws_ok(format('select pgfence_pgmq.finish(array[%L::uuid], ''purge'')', attempt_id), '22023', null,
                 'finish, which they name, knows archive and delete only') from again;

select * from finish();
rollback;

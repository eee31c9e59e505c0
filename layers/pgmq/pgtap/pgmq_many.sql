-- The pgmq layer's batches: archive_many / delete_many, archive's rule for each
-- attempt (accepted while the message was not read again, also after the lease expired;
-- duplicate for a retry; stale, recorded, otherwise), one row per id in the order given,
-- across queues; the guard of a protected queue table passed for the batch's writes only; a
-- bad batch (NULL, empty, over 1000 ids, a NULL or repeated id, any unknown id) 22023,
-- nothing changed.
begin;
select plan(36);
select pgfence_test.reset();

select pgmq.create('jobs');
select pgmq.create('other');
select pgmq.send('jobs', jsonb_build_object('n', n)) from generate_series(1, 6) n;
select pgmq.send('other', jsonb_build_object('n', n)) from generate_series(1, 2) n;
create temp table held on commit drop as select pgfence_test.lease('r', 'owner-r') as lease_id;
create temp table got on commit drop as
  select * from pgfence_pgmq.read((select lease_id from held), 'jobs', '30 s', 6);
create temp table got_other on commit drop as
  select * from pgfence_pgmq.read((select lease_id from held), 'other', '30 s', 2);

-- Bad batches: 22023, nothing changed.
select throws_ok($$ select * from pgfence_pgmq.archive_many(null) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must not be NULL', 'a NULL array');
select throws_ok($$ select * from pgfence_pgmq.delete_many('{}') $$, '22023',
                 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'an empty array');
select throws_ok($$ select * from pgfence_pgmq.archive_many(array(select gen_random_uuid() from generate_series(1, 1001))) $$,
                 '22023', 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'more than 1000 ids');
select throws_ok($$ select * from pgfence_pgmq.archive_many(array[array(select attempt_id from got where msg_id <= 2)]) $$,
                 '22023', 'pgfence: invalid argument attempt_ids: must be a one-dimensional array of 1 to 1000 attempt ids',
                 'a two-dimensional array');
select throws_ok($$ select * from pgfence_pgmq.archive_many(array(select attempt_id from got) || null::uuid) $$, '22023',
                 'pgfence: invalid argument attempt_ids: must not contain NULL', 'a NULL id');
select throws_ok($$ select * from pgfence_pgmq.delete_many(array(select attempt_id from got) || (select attempt_id from got where msg_id = 3)) $$,
                 '22023', 'pgfence: invalid argument attempt_ids: must not name an attempt twice', 'the same id twice');
select throws_ok($$ select * from pgfence_pgmq.archive_many(array(select attempt_id from got) || gen_random_uuid()) $$, '22023',
                 'pgfence: invalid argument attempt_id: is not an attempt id minted by pgfence_pgmq.read',
                 'an unknown id after valid ones fails the whole batch');
select pgfence.enqueue('tasks', '{}');
select throws_ok(format($$ select * from pgfence_pgmq.delete_many(%L::uuid || array(select attempt_id from got)) $$, attempt_id),
                 '22023', 'pgfence: invalid argument attempt_id: is not an attempt id minted by pgfence_pgmq.read',
                 'a task''s attempt id before valid ones fails the whole batch')
  from pgfence.claim((select lease_id from held), 'tasks');
select is((select count(*)::int from pgmq.q_jobs), 6, 'no bad batch took a message');
select is((select count(*)::int from pgfence_pgmq.attempts where outcome is not null), 0, 'nor recorded a result');
select is((select count(*)::int from pgfence.stale_results), 0, 'nor a stale one');

-- Accepted, in the order given.
select results_eq($$ select attempt_id, outcome from pgfence_pgmq.archive_many(array(select attempt_id from got where msg_id <= 3 order by msg_id desc)) $$,
                  $$ select attempt_id, 'accepted'::text from got where msg_id <= 3 order by msg_id desc $$,
                  'the readers archive their messages, one row per id in the order given');
select results_eq($$ select msg_id, read_ct from pgmq.a_jobs order by msg_id $$,
                  $$ values (1::bigint, 1), (2::bigint, 1), (3::bigint, 1) $$, 'the messages are in the archive');
select results_eq($$ select msg_id from pgmq.q_jobs order by msg_id $$, $$ values (4::bigint), (5::bigint), (6::bigint) $$,
                  'and no longer in the queue');
select results_eq($$ select outcome from pgfence_pgmq.delete_many(array(select attempt_id from got where msg_id <= 3 order by msg_id)) $$,
                  $$ values ('duplicate'::text), ('duplicate'), ('duplicate') $$,
                  'a retry, even as a delete, is a duplicate for each');
select is((select count(*)::int from pgmq.a_jobs), 3, 'and changes nothing');
select is(pgfence_pgmq.archive(attempt_id), 'duplicate', 'pgmq_archive agrees') from got where msg_id = 1;

-- After the lease expired, nobody having read the messages again: accepted.
select pgfence_test.expire(lease_id) from held;
select results_eq($$ select outcome from pgfence_pgmq.delete_many(array[(select attempt_id from got_other where msg_id = 2),
                                                                        (select attempt_id from got where msg_id = 6),
                                                                        (select attempt_id from got_other where msg_id = 1)]) $$,
                  $$ values ('accepted'::text), ('accepted'), ('accepted') $$,
                  'deletes after the lease expired, the messages not read again, are accepted, across queues');
select is((select count(*)::int from pgmq.q_other) + (select count(*)::int from pgmq.a_other), 0, 'deleted, not archived');
select is((select count(*)::int from pgmq.q_jobs where msg_id = 6) + (select count(*)::int from pgmq.a_jobs where msg_id = 6), 0,
          'from each queue');

-- Message 5 read again by a successor: its first attempt is stale; a mixed batch.
create temp table next on commit drop as select pgfence_test.lease('r', 'successor') as lease_id;
select pgfence_test.expire_message('jobs', 5);
create temp table again on commit drop as select * from pgfence_pgmq.read((select lease_id from next), 'jobs', '30 s', 1);
select results_eq($$ select msg_id, read_ct from again $$, $$ values (5::bigint, 2) $$, 'the successor reads message 5 again');
select results_eq($$ select outcome from pgfence_pgmq.archive_many(array[(select attempt_id from got where msg_id = 5),
                                                                         (select attempt_id from got where msg_id = 4)]) $$,
                  $$ values ('stale'::text), ('accepted') $$,
                  'in one statement over both messages, the first reader''s archive of message 5 is stale, of 4 accepted');
select results_eq($$ select msg_id, read_ct from pgmq.q_jobs where msg_id = 5 $$, $$ values (5::bigint, 2) $$,
                  'message 5 stays in the queue, the successor''s');
create temp table mixed on commit drop as
  select * from pgfence_pgmq.archive_many(
    array[(select attempt_id from got where msg_id = 5),    -- read again since: stale
          (select attempt_id from got where msg_id = 4),    -- archived already
          (select attempt_id from got where msg_id = 2),    -- archived already
          (select attempt_id from again)]) with ordinality as m(attempt_id, outcome, n);  -- holds message 5
select results_eq($$ select outcome from mixed order by n $$,
                  $$ values ('stale'::text), ('duplicate'), ('duplicate'), ('accepted') $$,
                  'a mixed batch, two attempts of one message among them: stale, duplicate, duplicate, accepted, in the order given');
select results_eq($$ select attempt_id from mixed order by n $$,
                  $$ values ((select attempt_id from got where msg_id = 5)), ((select attempt_id from got where msg_id = 4)),
                            ((select attempt_id from got where msg_id = 2)), ((select attempt_id from again)) $$,
                  'each row names its attempt');
select results_eq($$ select msg_id, read_ct from pgmq.a_jobs where msg_id in (4, 5) order by msg_id $$,
                  $$ values (4::bigint, 1), (5::bigint, 2) $$,
                  'message 4 archived by its reader, message 5 by its second reader: its read count is 2');
select results_eq($$ select msg_id, read_ct, kind, queue, report from pgfence_pgmq.stale_results $$,
                  $$ values (5::bigint, 1, 'archive'::text, 'jobs'::text, 1) $$,
                  'the stale attempt is recorded once, naming queue, message and read count');
select results_eq($$ select outcome from pgfence_pgmq.archive_many(array[(select attempt_id from got where msg_id = 5)]) $$,
                  $$ values ('stale'::text) $$, 'a retry of it is stale again');
select is((select count(*)::int from pgfence_pgmq.stale_results), 1, 'and adds no second record');

-- A protected queue table: the batch passes the guard for its own writes, and leaves the
-- transaction as unfenced as it found it.
create temp table held2 on commit drop as select pgfence_test.lease('r2', 'owner-r2') as lease_id;
select pgfence.protect('pgmq.q_jobs', array['r', 'r2'], 'enforce', consumers_only => true);
select pgmq.send('jobs', jsonb_build_object('n', n)) from generate_series(7, 8) n;
select pgfence_test.expire(lease_id) from next;
create temp table late on commit drop as
  select * from pgfence_pgmq.read((select lease_id from held2), 'jobs', '30 s', 1);
create temp table late2 on commit drop as
  select * from pgfence_pgmq.read(pgfence_test.lease('r', 'third'), 'jobs', '30 s', 1);
select set_config('pgfence.fenced', '', true);
select results_eq($$ select outcome from pgfence_pgmq.delete_many(array[(select attempt_id from late), (select attempt_id from late2)]) $$,
                  $$ values ('accepted'::text), ('accepted') $$,
                  'attempts of two resources delete from a table protected for both');
select is(current_setting('pgfence.fenced', true), '', 'the guard marker is put back as it was');
select throws_ok($$ delete from pgmq.q_jobs $$, 'PF007', null, 'so the rest of the transaction is not fenced by it');

-- Privileges.
select ok(has_function_privilege('pgfence_worker', f, 'execute'), 'pgfence_worker may call ' || f)
  from unnest(array['pgfence_pgmq.archive_many(uuid[])', 'pgfence_pgmq.delete_many(uuid[])']) f;
select ok(not has_function_privilege('public', f, 'execute'), 'PUBLIC may not call ' || f)
  from unnest(array['pgfence_pgmq.archive_many(uuid[])', 'pgfence_pgmq.delete_many(uuid[])']) f;

select * from finish();
rollback;

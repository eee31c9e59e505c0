-- pgfence_pgflow.set_vt (change pgflow_set_vt): a started task's attempt keeps its message
-- hidden for longer, and only while it holds the task: NULL once the task is finished, taken
-- over by another start, or put back to queued by pgflow (requeue_stalled_tasks); the message
-- is then left as it is. Bad arguments are refused.
begin;
select plan(18);
select pgfence_test.reset();

select has_function('pgfence_pgflow', 'set_vt', array['uuid', 'interval'], 'set_vt(attempt_id, vt)');
select is_definer('pgfence_pgflow', 'set_vt', array['uuid', 'interval'], 'set_vt is SECURITY DEFINER');
select ok((select p.proconfig @> array['search_path=pg_catalog, pg_temp'] from pg_proc p
            where p.oid = 'pgfence_pgflow.set_vt(uuid, interval)'::regprocedure),
          'with a pinned search_path');
select function_privs_are('pgfence_pgflow', 'set_vt', array['uuid', 'interval'], 'public', array[]::text[],
                          'PUBLIC may not execute it');
select function_privs_are('pgfence_pgflow', 'set_vt', array['uuid', 'interval'], 'pgfence_worker', array['EXECUTE'],
                          'a worker may');

select pgflow.create_flow('vt', timeout => 5);
select pgflow.add_step('vt', 'only');
select pgflow.start_flow('vt', '{"n": 1}');
select pgflow.start_flow('vt', '{"n": 2}');
select pgflow.start_flow('vt', '{"n": 3}');
create temp table a on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
create temp table got on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from a), 'vt', 'vt', '30 s', 3);
create temp table t1 on commit drop as select * from got order by msg_id limit 1;
create temp table t2 on commit drop as select * from got order by msg_id offset 1 limit 1;
create temp table t3 on commit drop as select * from got order by msg_id offset 2 limit 1;

select throws_ok($$ select pgfence_pgflow.set_vt(null, '1 hour') $$, '22023', null, 'a NULL attempt_id is refused');
select throws_ok($$ select pgfence_pgflow.set_vt(gen_random_uuid(), '1 hour') $$, '22023', null,
                 'an attempt id the layer never minted is refused');
select throws_ok($$ select pgfence_pgflow.set_vt((select attempt_id from t1), null) $$, '22023', null,
                 'a NULL vt is refused');
select throws_ok($$ select pgfence_pgflow.set_vt((select attempt_id from t1), '-1 s') $$, '22023', null,
                 'a negative vt is refused');

select ok(pgfence_pgflow.set_vt((select attempt_id from t1), '1 hour') between clock_timestamp() + interval '59 minutes'
                                                                          and clock_timestamp() + interval '1 hour',
          'the attempt that holds its task keeps its message for vt from now');
select ok((select vt > clock_timestamp() + interval '59 minutes' from pgmq.q_vt where msg_id = (select msg_id from t1)),
          'the message is hidden that long');

-- Finished: pgflow archived the message; nothing to keep.
select is(pgfence_pgflow.complete_task((select attempt_id from t1), '{}'), 'accepted', 't1 completed');
select is(pgfence_pgflow.set_vt((select attempt_id from t1), '1 hour'), null, 'a finished attempt keeps nothing');

-- Taken over: t2 stalled (its message back past its step's timeout + 2 s) and another worker
-- function started it again.
select pgfence_test.stall_task('vt', (select msg_id from t2));
create temp table b on commit drop as select pgfence_test.lease('other-fn', 'owner-b') as lease_id;
select is((select count(*)::int from pgfence_pgflow.start_tasks((select lease_id from b), 'vt', 'vt', '30 s', 1)), 1,
          'owner-b takes t2 over');
create temp table t2_vt on commit drop as select vt from pgmq.q_vt where msg_id = (select msg_id from t2);
select is(pgfence_pgflow.set_vt((select attempt_id from t2), '1 hour'), null, 'the superseded attempt keeps nothing');
select is((select vt from pgmq.q_vt where msg_id = (select msg_id from t2)), (select vt from t2_vt),
          'and the new attempt''s message is left as it was');

-- Put back to queued by pgflow (requeue_stalled_tasks, pgflow 0.13+), its message not read
-- again yet: no longer the attempt's either.
update pgflow.step_tasks set status = 'queued', started_at = null
 where message_id = (select msg_id from t3);
select pgfence_test.expire_message('vt', (select msg_id from t3));
select is(pgfence_pgflow.set_vt((select attempt_id from t3), '1 hour'), null, 'an attempt whose task was requeued keeps nothing');
select ok((select vt <= clock_timestamp() from pgmq.q_vt where msg_id = (select msg_id from t3)),
          'its message stays visible, for the next read');

select * from finish();
rollback;

-- pgfence_pgflow.complete_many and fail_many (change pgflow_complete_many): a batch's results in
-- one call, each attempt's verdict and effect exactly those of complete_task / fail_task on the
-- same state (accepted, duplicate, stale after a takeover, in one mixed batch); an unknown id
-- or a bad batch changes nothing; the caller's lock_timeout is put back and the transaction's
-- idle time bounded. start_tasks hides a batch's messages for the worker's stated hold. The
-- lock order across batches is driven in tests/test_pgflow.py.
begin;
select plan(25);
select pgfence_test.reset();

select has_function('pgfence_pgflow', 'complete_many', array['uuid[]', 'jsonb[]'],
                    'complete_many(attempt_ids, outputs)');
select has_function('pgfence_pgflow', 'fail_many', array['uuid[]', 'text[]'], 'fail_many(attempt_ids, error_messages)');
select is_definer('pgfence_pgflow', 'finish_many', array['uuid[]', 'text', 'jsonb[]', 'text[]'],
                  'finish_many is SECURITY DEFINER');
select function_privs_are('pgfence_pgflow', 'complete_many', array['uuid[]', 'jsonb[]'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker may complete a batch');
select function_privs_are('pgfence_pgflow', 'fail_many', array['uuid[]', 'text[]'], 'pgfence_worker',
                          array['EXECUTE'], 'and fail one');

-- Four tasks started by owner-a in one batch, held for 4 × 20 s.
select pgflow.create_flow('b', timeout => 5);
select pgflow.add_step('b', 'only');
select pgflow.start_flow('b', format('{"n": %s}', n)::jsonb) from generate_series(1, 4) n;
create temp table a on commit drop as select pgfence_test.lease('fn', 'owner-a') as lease_id;
create temp table got on commit drop as
  select row_number() over (order by msg_id) as k, *
    from pgfence_pgflow.start_tasks((select lease_id from a), 'b', 'b', '80 s', 4);
select ok((select bool_and(m.vt > clock_timestamp() + interval '70 s') from pgmq.q_b m join got using (msg_id)),
          'the start hides each task''s message for the batch''s hold, longer than the step''s timeout + 2 s');
create temp table short on commit drop as select pgfence_test.lease('fn-short', 'owner-s') as lease_id;
select pgflow.create_flow('s', timeout => 5);
select pgflow.add_step('s', 'only');
select pgflow.start_flow('s', '{}');
create temp table one on commit drop as select * from pgfence_pgflow.start_tasks((select lease_id from short), 's', 's', '2 s', 1);
select ok((select m.vt between clock_timestamp() + interval '3 s' and clock_timestamp() + interval '8 s'
             from one join pgmq.q_s m using (msg_id)),
          'a hold shorter than the step''s timeout + 2 s leaves pgflow''s rule');

-- The states: t1 finished by its attempt (its retry is a duplicate), t2 taken over by owner-b
-- (owner-a's result is stale), t3 and t4 still held (accepted).
select is(pgfence_pgflow.complete_task((select attempt_id from got where k = 1), '{"r": 1}'), 'accepted', 't1 completed');
select pgfence_test.stall_task('b', (select msg_id from got where k = 2));
create temp table b on commit drop as select pgfence_test.lease('other-fn', 'owner-b') as lease_id;
create temp table again on commit drop as
  select * from pgfence_pgflow.start_tasks((select lease_id from b), 'b', 'b', '30 s', 1);
select is((select msg_id from again), (select msg_id from got where k = 2), 'owner-b took t2 over');

-- A call, its verdicts and what it changed, then undone: the batch and the single calls are
-- run on the same state. (An exception block rolls its work back; the result is carried out in
-- the error's message.)
create function pg_temp.undone(q text) returns jsonb language plpgsql as $$
declare
  v jsonb;
begin
  begin
    execute q into v;
    v := jsonb_build_object(
      'verdicts', v,
      'tasks', (select jsonb_agg(jsonb_build_array(st.status, st.attempts_count, st.output, st.error_message)
                                 order by st.message_id)
                  from pgflow.step_tasks st where st.flow_slug = 'b'),
      'stale', (select jsonb_agg(jsonb_build_array(s.kind, s.body) order by s.kind, s.body::text)
                  from pgfence_pgflow.stale_results s),
      'outcomes', (select jsonb_agg(x.outcome order by x.msg_id, x.attempts_count)
                     from pgfence_pgflow.attempts x where x.flow_slug = 'b'));
    raise exception using errcode = 'P0004', message = v::text;
  exception when sqlstate 'P0004' then
    return sqlerrm::jsonb;
  end;
end
$$;
create temp table batch on commit drop as
  select x.id, x.n from unnest(array[(select attempt_id from got where k = 1), (select attempt_id from got where k = 2),
                                     (select attempt_id from got where k = 3), (select attempt_id from again),
                                     (select attempt_id from got where k = 4)]) with ordinality x(id, n);

select is(pg_temp.undone($$ select jsonb_agg(m.outcome order by m.n)
                              from pgfence_pgflow.complete_many(array(select id from batch order by n),
                                                               array(select jsonb_build_object('r', n) from batch order by n))
                                   with ordinality m(attempt_id, outcome, n) $$) -> 'verdicts',
          '["duplicate", "stale", "accepted", "accepted", "accepted"]',
          'a mixed batch: duplicate, stale after a takeover, accepted, one verdict per id in the order given');
select is(pg_temp.undone($$ select jsonb_agg(m.outcome order by m.n)
                              from pgfence_pgflow.complete_many(array(select id from batch order by n),
                                                               array(select jsonb_build_object('r', n) from batch order by n))
                                   with ordinality m(attempt_id, outcome, n) $$),
          pg_temp.undone($$ select jsonb_agg(pgfence_pgflow.complete_task(id, jsonb_build_object('r', n)) order by n)
                              from (select * from batch order by n) b $$),
          'complete_many: the verdicts and the effects (pgflow''s tasks, stale results, outcomes) of complete_task on each');
select is(pg_temp.undone($$ select jsonb_agg(m.outcome order by m.n)
                              from pgfence_pgflow.fail_many(array(select id from batch order by n),
                                                           array(select 'boom ' || n from batch order by n))
                                   with ordinality m(attempt_id, outcome, n) $$),
          pg_temp.undone($$ select jsonb_agg(pgfence_pgflow.fail_task(id, 'boom ' || n) order by n)
                              from (select * from batch order by n) b $$),
          'fail_many: those of fail_task on each');
select is(pg_temp.undone($$ select jsonb_agg(m.outcome)
                              from pgfence_pgflow.complete_many(array[(select attempt_id from got where k = 2)]) m $$)
            -> 'verdicts',
          '["stale"]', 'a batch of one superseded attempt: stale');

-- The attempt ids of each result, as given.
select results_eq($$ select attempt_id from pgfence_pgflow.complete_many(array(select id from batch order by n desc)) $$,
                  $$ select id from batch order by n desc $$, 'one row per id, in the order given');
select is((select count(*)::int from pgflow.step_tasks where flow_slug = 'b' and status = 'completed'), 4,
          'that batch completed t3, t4 and owner-b''s t2');
select is(pgfence_pgflow.complete_task((select attempt_id from got where k = 3), '{}'), 'duplicate',
          'a single retry of a batch''s result is a duplicate');

-- Bad batches change nothing.
select pgflow.start_flow('b', '{"n": 5}');
create temp table fifth on commit drop as select * from pgfence_pgflow.start_tasks((select lease_id from a), 'b', 'b', '30 s', 1);
select throws_ok($$ select * from pgfence_pgflow.complete_many(array[(select attempt_id from fifth), gen_random_uuid()]) $$,
                 '22023', null, 'an unknown attempt id raises');
select is((select status from pgflow.step_tasks where message_id = (select msg_id from fifth)), 'started',
          'and the batch''s known attempt is not completed');
select throws_ok($$ select * from pgfence_pgflow.complete_many(null) $$, '22023', null, 'NULL ids');
select throws_ok($$ select * from pgfence_pgflow.complete_many('{}') $$, '22023', null, 'no ids');
select throws_ok($$ select * from pgfence_pgflow.complete_many(array[(select attempt_id from fifth), (select attempt_id from fifth)]) $$,
                 '22023', null, 'an id twice');
select throws_ok($$ select * from pgfence_pgflow.complete_many(array[(select attempt_id from fifth)], array['{}', '{}']::jsonb[]) $$,
                 '22023', null, 'outputs of another length');

-- The caller's lock_timeout back; the transaction's idle time bounded.
set local lock_timeout = '1min';
set local idle_in_transaction_session_timeout = 0;
select is((select outcome from pgfence_pgflow.complete_many(array[(select attempt_id from fifth)], array['{"ok": 1}'::jsonb])),
          'accepted', 'the fifth completed');
select is(current_setting('lock_timeout'), '1min', 'the caller''s lock_timeout is put back');
select is(current_setting('idle_in_transaction_session_timeout'), '5s', 'the transaction may idle 5 s at most');

select * from finish();
rollback;

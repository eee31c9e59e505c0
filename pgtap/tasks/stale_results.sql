-- Stale results (I5): each different report of a superseded attempt is kept, a retry adds
-- nothing, an older attempt is checked against the lease it was claimed under (nobody makes
-- up stale results), and one task attempt stores at most 10.
begin;
select plan(12);
select pgfence_test.reset();
select pgfence_test.lease('r') as lease \gset
select pgfence.enqueue('q');
create temp table a1 on commit drop as select * from pgfence.claim(:'lease', 'q');
select pgfence_test.expire_attempt(attempt_id) from a1;
select pgfence.requeue_expired();
create temp table a2 on commit drop as select * from pgfence.claim(:'lease', 'q');
select pgfence_test.expire_attempt(attempt_id) from a2;
select pgfence.requeue_expired();
create temp table a3 on commit drop as select * from pgfence.claim(:'lease', 'q');

select is(pgfence.complete((select attempt_id from a1), '{"n": 1}'), 'stale', 'attempt 1 is stale');
select is(pgfence.complete((select attempt_id from a1), '{"n": 1}'), 'stale', 'its retry is stale');
select is((select count(*) from pgfence.stale_results), 1::bigint, 'and the retry adds nothing');
select is(pgfence.fail((select attempt_id from a1), '{"n": 2}'), 'stale', 'a second, different report');
select results_eq($$ select report, kind, body from pgfence.stale_results order by report $$,
                  $$ values (1, 'complete'::text, '{"n": 1}'::jsonb), (2, 'fail', '{"n": 2}') $$,
                  'both reports are kept, numbered');
select is(pgfence.complete((select attempt_id from a2), '{"from": 2}'), 'stale', 'attempt 2 is stale too');

-- Made-up ids for older attempts: the right shape, a wrong signature.
select throws_ok(format($$ select pgfence.complete(%L, '{}') $$,
                        pgfence_test.forged_attempt((select task_id from a1), 2)),
                 '22023', null, 'a forged id of an older attempt is refused');
select throws_ok(format($$ select pgfence.fail(%L, '{}') $$,
                        pgfence_test.forged_attempt((select task_id from a1), 1)),
                 '22023', null, 'another one is refused');
select is((select count(*) from pgfence.stale_results), 3::bigint, 'and recorded nothing');

-- The bound: ten different reports of one attempt, then an error rather than an eleventh row.
select pgfence.complete((select attempt_id from a2), jsonb_build_object('n', n)) from generate_series(2, 10) n;
select is((select count(*) from pgfence.stale_results s join a2 using (attempt_id)), 10::bigint,
          'ten reports of attempt 2 are kept');
select throws_ok(format($$ select pgfence.complete(%L, '{"n": 11}') $$, (select attempt_id from a2)),
                 '54000', null, 'an eleventh is refused with 54000, not dropped');
select is(pgfence.complete((select attempt_id from a3), '{"current": true}'), 'accepted',
          'the current attempt is untouched by all of it');

select * from finish();
rollback;

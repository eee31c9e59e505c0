-- update_status: one row per resource of a window with what is left of its drain, and a
-- verdict: draining (a live draining lease, a task in flight, a pending start or an active
-- owner), drained (observed quiet: not proof a runtime terminated), unknown (a draining lease
-- went silent while its attempts still hold tasks), finished. Reads only: it answers in a
-- read-only transaction. PF005 for an unknown token, 22023 for NULL.
begin;
select plan(38);
select pgfence_test.reset();

-- busy, handover, silent: held, each owner with a task in flight; starting: a start requested
-- before the window; intruder: enabled and idle; off: disabled before the window.
select pgfence.register('busy');
select pgfence.register('handover');
select pgfence.register('silent');
select pgfence.register('starting');
select pgfence.register('intruder');
select pgfence.register('off', false);
create temp table busy on commit drop as select pgfence_test.lease('busy', 'owner-busy') as lease_id;
create temp table handover on commit drop as select pgfence_test.lease('handover', 'owner-handover') as lease_id;
create temp table silent on commit drop as select pgfence_test.lease('silent', 'owner-silent') as lease_id;
select pgfence.enqueue('q-busy', '{"job": "busy"}');
select pgfence.enqueue('q-handover', '{"job": "handover"}');
select pgfence.enqueue('q-silent', '{"job": "silent"}');
create temp table busy_task on commit drop as select * from pgfence.claim((select lease_id from busy), 'q-busy');
create temp table handover_task on commit drop as select * from pgfence.claim((select lease_id from handover), 'q-handover');
create temp table silent_task on commit drop as select * from pgfence.claim((select lease_id from silent), 'q-silent');
create temp table inv on commit drop as select pgfence.request_start('starting') as invocation_id;

create temp table w on commit drop as
  select pgfence.prepare_update(array['busy', 'handover', 'silent', 'starting', 'intruder', 'off'], gen_random_uuid()) as token;

-- Right after prepare.
select isnt((select invocation_id from inv), null, 'a start was requested before the window');
select results_eq($$ select resource, saved_enabled, enabled, active_owner, draining_leases, in_flight_tasks,
                            pending_invocations, verdict
                       from pgfence.update_status((select token from w)) $$,
                  $$ values ('busy'::text, true, false, null::text, 1::bigint, 1::bigint, 0::bigint, 'draining'::text),
                            ('handover', true, false, null, 1, 1, 0, 'draining'),
                            ('intruder', true, false, null, 0, 0, 0, 'drained'),
                            ('off', false, false, null, 0, 0, 0, 'drained'),
                            ('silent', true, false, null, 1, 1, 0, 'draining'),
                            ('starting', true, false, null, 0, 0, 1, 'draining') $$,
                  'one row per resource, in name order: saved and current enabled, the counts and the verdicts');
select is((select last_heartbeat from pgfence.update_status((select token from w)) where resource = 'busy'),
          (select acquired_at from pgfence.lease_status where owner = 'owner-busy'),
          'before any renewal the last heartbeat is the draining lease''s acquired_at');
select is((select last_heartbeat from pgfence.update_status((select token from w)) where resource = 'starting'),
          null, 'a resource without a draining lease has no heartbeat');

-- busy: the drained owner renews, finishes its task, releases.
select pgfence.renew(lease_id, '30 seconds') from busy;
select is((select last_heartbeat from pgfence.update_status((select token from w)) where resource = 'busy'),
          (select renewed_at from pgfence.lease_status where owner = 'owner-busy'),
          'after a renewal the last heartbeat is the draining lease''s renewed_at');
select is(pgfence.complete((select attempt_id from busy_task)), 'accepted', 'the drained owner completes its task');
select results_eq($$ select draining_leases, in_flight_tasks, verdict from pgfence.update_status((select token from w))
                      where resource = 'busy' $$,
                  $$ values (1::bigint, 0::bigint, 'draining'::text) $$,
                  'draining while the drained lease is live, even with no task in flight');
select is(pgfence.release((select lease_id from busy)), true, 'the drained owner releases');
select results_eq($$ select active_owner, draining_leases, in_flight_tasks, pending_invocations, verdict
                       from pgfence.update_status((select token from w)) where resource = 'busy' $$,
                  $$ values (null::text, 0::bigint, 0::bigint, 0::bigint, 'drained'::text) $$,
                  'drained once the owner released and holds nothing');
select is((select last_heartbeat from pgfence.update_status((select token from w)) where resource = 'busy'), null,
          'a released lease is no longer a heartbeat to watch');

-- handover: the owner releases while a task is still in flight.
select pgfence.release(lease_id) from handover;
select results_eq($$ select draining_leases, in_flight_tasks, verdict from pgfence.update_status((select token from w))
                      where resource = 'handover' $$,
                  $$ values (0::bigint, 1::bigint, 'draining'::text) $$,
                  'draining while a task is in flight, though no lease is left');
select is(pgfence.complete((select attempt_id from handover_task)), 'accepted', 'the task is completed after the release');
select results_eq($$ select in_flight_tasks, verdict from pgfence.update_status((select token from w)) where resource = 'handover' $$,
                  $$ values (0::bigint, 'drained'::text) $$,
                  'drained once no task is in flight');

-- silent: the draining lease goes silent while its task is still claimed.
select pgfence_test.expire(lease_id) from silent;
select results_eq($$ select in_flight_tasks, verdict from pgfence.update_status((select token from w)) where resource = 'silent' $$,
                  $$ values (1::bigint, 'unknown'::text) $$,
                  'unknown when a draining lease went silent while a task is still claimed by it');
select is((select last_heartbeat from pgfence.update_status((select token from w)) where resource = 'silent'),
          (select acquired_at from pgfence.lease_status where owner = 'owner-silent'),
          'the last heartbeat is the silent lease''s, to show how long it has been quiet');
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from silent), '30 seconds'), 'PF001', null,
                 'the silent lease cannot come back by renewing');
select is((select verdict from pgfence.update_status((select token from w)) where resource = 'silent'), 'unknown',
          'and stays unknown');
select is(pgfence.complete((select attempt_id from silent_task)), 'accepted', 'its late result is still accepted');
select results_eq($$ select in_flight_tasks, verdict from pgfence.update_status((select token from w)) where resource = 'silent' $$,
                  $$ values (0::bigint, 'drained'::text) $$,
                  'drained once the silent lease holds nothing');

-- starting: the start requested before the window is pending until it expires.
select is((select verdict from pgfence.update_status((select token from w)) where resource = 'starting'), 'draining',
          'draining while a start requested before the window is pending');
select pgfence_test.expire_invocation(invocation_id) from inv;
select results_eq($$ select pending_invocations, verdict from pgfence.update_status((select token from w)) where resource = 'starting' $$,
                  $$ values (0::bigint, 'drained'::text) $$,
                  'drained once the invocation expired');

-- intruder: enabled inside the window, then an unexpected worker acquires it.
select pgfence.set_enabled('intruder', true);
select results_eq($$ select enabled, verdict from pgfence.update_status((select token from w)) where resource = 'intruder' $$,
                  $$ values (true, 'drained'::text) $$,
                  'update_status shows enabled as it is now');
select isnt((pgfence.acquire('intruder', 'unexpected-worker', '30 seconds')).lease_id, null,
            'an unexpected worker acquires the re-enabled resource');
select results_eq($$ select active_owner, draining_leases, verdict from pgfence.update_status((select token from w))
                      where resource = 'intruder' $$,
                  $$ values ('unexpected-worker'::text, 0::bigint, 'draining'::text) $$,
                  'active_owner names the unexpected worker, and the verdict is not drained');

-- The whole window now.
select results_eq($$ select resource, verdict from pgfence.update_status((select token from w)) $$,
                  $$ values ('busy'::text, 'drained'::text), ('handover', 'drained'), ('intruder', 'draining'),
                            ('off', 'drained'), ('silent', 'drained'), ('starting', 'drained') $$,
                  'every resource but the one with an unexpected owner is drained');

-- Finished.
select pgfence.finish_update(token) from w;
select is_empty($$ select resource from pgfence.update_status((select token from w)) where verdict <> 'finished' $$,
                'after finish_update every verdict is finished');
select is((select count(*) from pgfence.update_status((select token from w))), 6::bigint,
          'and every resource still has its row');
select results_eq($$ select resource, saved_enabled, enabled from pgfence.update_status((select token from w)) $$,
                  $$ values ('busy'::text, true, true), ('handover', true, true), ('intruder', true, true),
                            ('off', false, false), ('silent', true, true), ('starting', true, true) $$,
                  'it still shows the saved values and the restored ones');

-- Refused tokens.
select throws_ok(format('select * from pgfence.update_status(%L)', gen_random_uuid()), 'PF005', null,
                 'an unknown token is refused');
select throws_ok($$ select * from pgfence.update_status(null) $$, '22023', null, 'a NULL token is refused');
select throws_like($$ select * from pgfence.update_status(null) $$, '%token%', 'the error names the token argument');

-- A second window left open, then everything from here on in a read-only transaction.
create temp table w2 on commit drop as
  select pgfence.prepare_update(array['busy', 'intruder'], gen_random_uuid()) as token;
set local transaction_read_only = on;
select is(current_setting('transaction_read_only'), 'on', 'the transaction is read-only from here on');
select throws_ok($$ select pgfence.set_enabled('off', true) $$, '25006', null, 'a write is refused in it');
select lives_ok(format('select * from pgfence.update_status(%L)', (select token from w2)),
                'update_status runs in a read-only transaction');
select results_eq($$ select resource, saved_enabled, enabled, active_owner, draining_leases, verdict
                       from pgfence.update_status((select token from w2)) $$,
                  $$ values ('busy'::text, true, false, null::text, 0::bigint, 'drained'::text),
                            ('intruder', true, false, null, 1, 'draining') $$,
                  'and answers there for an open window: the unexpected worker''s lease is now draining');
select results_eq($$ select resource, verdict from pgfence.update_status((select token from w)) $$,
                  $$ values ('busy'::text, 'finished'::text), ('handover', 'finished'), ('intruder', 'finished'),
                            ('off', 'finished'), ('silent', 'finished'), ('starting', 'finished') $$,
                  'and for a finished one');
select throws_ok(format('select * from pgfence.update_status(%L)', gen_random_uuid()), 'PF005', null,
                 'an unknown token is PF005 there too');
select is((select count(*) from pgfence.open_updates), 1::bigint, 'open_updates is readable there too');

select * from finish();
rollback;

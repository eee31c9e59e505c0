-- prepare_update: validates the whole set first (22023 for a bad set, PF002 listing every
-- unknown name, both changing nothing); saves each resource's exact enabled, disables them and
-- drains their active leases; a retry with the same request_id and set returns the same token
-- and never overwrites the saved values (the lost-response case); a reused request_id with
-- another set and an overlap with an open window are PF004. A window touches only its resources.
begin;
select plan(57);
select pgfence_test.reset();

-- on-held: enabled, held, its owner has two tasks in flight; off: disabled before the window;
-- on-idle: enabled, never held; bystander: enabled and held, outside every window.
select pgfence.register('on-held');
select pgfence.register('off', false);
select pgfence.register('on-idle');
select pgfence.register('bystander');
create temp table held on commit drop as
  select pgfence_test.lease('on-held', 'owner-held') as lease_id;
create temp table other on commit drop as
  select pgfence_test.lease('bystander', 'owner-bystander') as lease_id;
select pgfence.enqueue('q-held', '{"job": "held"}');
select pgfence.enqueue('q-slow', '{"job": "slow"}');
select pgfence.enqueue('q-other', '{"job": "other"}');
create temp table held_task on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q-held');
create temp table slow_task on commit drop as
  select * from pgfence.claim((select lease_id from held), 'q-slow');
create temp table other_task on commit drop as
  select * from pgfence.claim((select lease_id from other), 'q-other');
create temp table req on commit drop as
  select gen_random_uuid() as request_id;

-- Bad sets: 22023, naming the argument, before anything is looked at or changed.
select throws_ok($$ select pgfence.prepare_update(array['on-held'], null) $$, '22023', null,
                 'a NULL request_id is refused');
select throws_like($$ select pgfence.prepare_update(array['on-held'], null) $$, '%request_id%',
                   'the error names the request_id argument');
select throws_ok(format('select pgfence.prepare_update(null, %L)', (select request_id from req)), '22023', null,
                 'a NULL array is refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', '{}'::text[], (select request_id from req)), '22023', null,
                 'an empty array is refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['on-held', null], (select request_id from req)), '22023', null,
                 'an array with a NULL element is refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'bad name'], (select request_id from req)), '22023', null,
                 'an array with a bad name is refused');
select throws_like(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'bad name'], (select request_id from req)), '%resources%',
                   'the error names the resources argument');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'off', 'on-held'], (select request_id from req)), '22023', null,
                 'an array naming a resource twice is refused');
select throws_like(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'off', 'on-held'], (select request_id from req)),
                   '%resources%more than once%', 'the error says a resource is named more than once');
select throws_ok(format('select pgfence.prepare_update(%L, %L)',
                        (select array_agg('r' || g) from generate_series(1, 1001) g), (select request_id from req)), '22023', null,
                 'more than 1000 names are refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)',
                        (select array_agg('r' || g) from generate_series(1, 1000) g), (select request_id from req)), 'PF002', null,
                 '1000 names pass the checks (and are unknown)');

-- Unknown names: PF002 listing every one of them; the known names in the call are untouched.
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'nope-2', 'on-idle', 'nope-1'], (select request_id from req)),
                 'PF002', null, 'unknown names are refused');
select throws_like(format('select pgfence.prepare_update(%L, %L)', array['on-held', 'nope-2', 'on-idle', 'nope-1'], (select request_id from req)),
                   '%unknown resources: nope-1, nope-2', 'the error lists all the unknown names');

select results_eq($$ select resource, enabled, open_update from pgfence.resource_status order by resource $$,
                  $$ values ('bystander'::text, true, null::uuid), ('off', false, null), ('on-held', true, null), ('on-idle', true, null) $$,
                  'the refused calls changed no enabled and opened no window');
select results_eq($$ select owner, status from pgfence.lease_status order by owner $$,
                  $$ values ('owner-bystander'::text, 'current'::text), ('owner-held', 'current') $$,
                  'and drained no lease');
select is_empty($$ select * from pgfence.open_updates $$, 'open_updates lists nothing');

-- The window: exact enabled saved, all disabled, the active lease drained.
create temp table w on commit drop as
  select pgfence.prepare_update(array['on-idle', 'on-held', 'off'], (select request_id from req)) as token;
select isnt((select token from w), null, 'prepare_update returns a token');
select results_eq($$ select resource, saved_enabled from pgfence.update_status((select token from w)) $$,
                  $$ values ('off'::text, false), ('on-held', true), ('on-idle', true) $$,
                  'it saved each resource''s exact enabled, disabled ones as disabled');
select results_eq($$ select resource, enabled from pgfence.resource_status where resource <> 'bystander' order by resource $$,
                  $$ values ('off'::text, false), ('on-held', false), ('on-idle', false) $$,
                  'it disabled all of them');
select is((select status from pgfence.lease_status where owner = 'owner-held'), 'draining',
          'the active lease is draining');
select is((select draining_leases from pgfence.resource_status where resource = 'on-held'), 1::bigint,
          'resource_status counts the draining lease');
select is((select owner from pgfence.resource_status where resource = 'on-held'), null,
          'the resource has no current owner any more');
select is((select state from pgfence.renew((select lease_id from held), '30 seconds')), 'draining',
          'the drained owner still renews, with state draining');
select throws_ok(format('select * from pgfence.claim(%L, %L)', (select lease_id from held), 'q-held'), 'PF001', null,
                 'the drained owner cannot claim');
select is(pgfence.complete((select attempt_id from held_task), '{"done": true}'), 'accepted',
          'the drained owner completes a task it holds');
select throws_ok($$ select pgfence.acquire('on-held', 'successor', '30 seconds') $$, 'PF003', null,
                 'nobody acquires a resource in the window: it is disabled');
select throws_ok($$ select pgfence.acquire('on-idle', 'newcomer', '30 seconds') $$, 'PF003', null,
                 'not even one that was never held');
select is(pgfence.request_start('on-idle'), null, 'and no start is requested for it');
select results_eq($$ select token, resources from pgfence.open_updates $$,
                  $$ select token, array['off', 'on-held', 'on-idle']::text[] from w $$,
                  'open_updates lists the token with its set');
select results_eq($$ select resource, open_update from pgfence.resource_status order by resource $$,
                  $$ values ('bystander'::text, null::uuid), ('off', (select token from w)),
                            ('on-held', (select token from w)), ('on-idle', (select token from w)) $$,
                  'resource_status names the open token for each resource in the window, and only for those');

-- Retry after a lost response: same token, saved values untouched though all are disabled now.
select is(pgfence.prepare_update(array['off', 'on-held', 'on-idle'], (select request_id from req)), (select token from w),
          'a retry with the same request_id and the same set in another order returns the same token');
select results_eq($$ select resource, saved_enabled, enabled from pgfence.update_status((select token from w)) $$,
                  $$ values ('off'::text, false, false), ('on-held', true, false), ('on-idle', true, false) $$,
                  'the retry kept the original saved values, not the temporary false');
select is(pgfence.prepare_update(array['on-idle', 'off', 'on-held'], (select request_id from req)), (select token from w),
          'a second retry returns the same token again');
select is((select count(*) from pgfence.open_updates), 1::bigint, 'the retries opened no second window');
select is((select count(*) from pgfence.update_status((select token from w))), 3::bigint,
          'and the window still has one row per resource');
select results_eq($$ select owner, status from pgfence.lease_status order by owner $$,
                  $$ values ('owner-bystander'::text, 'current'::text), ('owner-held', 'draining') $$,
                  'the retries changed no lease');

-- The same request_id for another set: PF004.
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['off', 'on-held'], (select request_id from req)), 'PF004', null,
                 'the same request_id with a subset is refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['bystander', 'off', 'on-held', 'on-idle'], (select request_id from req)),
                 'PF004', null, 'the same request_id with a superset is refused');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['bystander'], (select request_id from req)), 'PF004', null,
                 'the same request_id with a disjoint set is refused');
select is((select enabled from pgfence.resource_status where resource = 'bystander'), true,
          'the refused request left the resource outside the window enabled');

-- Overlap with an open window: PF004 naming the open token, nothing changed.
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['bystander', 'on-idle'], gen_random_uuid()), 'PF004', null,
                 'a set with a resource already in an open window is refused');
select throws_like(format('select pgfence.prepare_update(%L, %L)', array['bystander', 'on-idle'], gen_random_uuid()),
                   '%(update ref ' || pgfence.ref((select token from w)) || ')%',
                   'the error names the open window by its token''s digest, never the token');
select throws_ok(format('select pgfence.prepare_update(%L, %L)', array['off', 'on-held', 'on-idle'], gen_random_uuid()), 'PF004', null,
                 'the same set under a new request_id is refused too');
select results_eq($$ select resource, enabled, open_update from pgfence.resource_status where resource = 'bystander' $$,
                  $$ values ('bystander'::text, true, null::uuid) $$,
                  'the refused window left the other resource enabled and outside any window');
select is((select status from pgfence.lease_status where owner = 'owner-bystander'), 'current',
          'and its lease current');
select is((select count(*) from pgfence.open_updates), 1::bigint, 'no window was added');
select results_eq($$ select resource, saved_enabled from pgfence.update_status((select token from w)) $$,
                  $$ values ('off'::text, false), ('on-held', true), ('on-idle', true) $$,
                  'the open window kept its saved values');

-- A window touches only its resources.
select is((select enabled from pgfence.resource_status where resource = 'bystander'), true,
          'a resource outside the window keeps its enabled');
select isnt(pgfence.fence((select lease_id from other)), null, 'its owner still fences');
select pgfence.enqueue('q-other', '{"job": "other 2"}');
select results_eq(format('select payload from pgfence.claim(%L, %L)', (select lease_id from other), 'q-other'),
                  $$ values ('{"job": "other 2"}'::jsonb) $$,
                  'its owner keeps claiming');
select pgfence_test.expire_attempt(attempt_id) from slow_task;
select pgfence_test.expire_attempt(attempt_id) from other_task;
select is(pgfence.requeue_expired(), 2, 'requeue_expired requeues overdue tasks of the drained owner and of the other owner');
select results_eq($$ select t.queue, t.state from pgfence.tasks t
                     where t.task_id in (select task_id from slow_task union all select task_id from other_task)
                     order by t.queue $$,
                  $$ values ('q-other'::text, 'queued'::text), ('q-slow', 'queued') $$,
                  'both are queued again');

-- A second window over other resources opens beside the first.
create temp table w2 on commit drop as
  select pgfence.prepare_update(array['bystander'], gen_random_uuid()) as token;
select isnt((select token from w2), (select token from w), 'a disjoint set opens a second window with its own token');
select results_eq($$ select resource, saved_enabled, enabled from pgfence.update_status((select token from w2)) $$,
                  $$ values ('bystander'::text, true, false) $$,
                  'the second window saved and disabled only its resource');
select is((select status from pgfence.lease_status where owner = 'owner-bystander'), 'draining',
          'and drained only its lease');
select is((select count(*) from pgfence.open_updates), 2::bigint, 'open_updates lists both windows');
select results_eq($$ select resource, saved_enabled from pgfence.update_status((select token from w)) $$,
                  $$ values ('off'::text, false), ('on-held', true), ('on-idle', true) $$,
                  'the first window is unchanged by the second');

select * from finish();
rollback;

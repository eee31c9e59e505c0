-- finish_update: restores exactly the saved enabled values: restored (it was enabled),
-- kept_disabled (it was disabled: never enabled by a finish, I6), conflict (set_enabled was
-- called inside the window, to any value: the operator's decision is left as it is),
-- already_finished on every later call, changing nothing. PF005 for an unknown token, 22023
-- for NULL.
begin;
select plan(33);
select pgfence_test.reset();

-- In the window: restore-me (enabled, held), keep-off (disabled), op-on (disabled, enabled by
-- the operator inside the window), op-off (enabled, disabled again by the operator inside the
-- window: the value it already had there), op-off-again (disabled, disabled again inside).
-- Outside it: outside-on, outside-off.
select pgfence.register('restore-me');
select pgfence.register('keep-off', false);
select pgfence.register('op-on', false);
select pgfence.register('op-off');
select pgfence.register('op-off-again', false);
select pgfence.register('outside-on');
select pgfence.register('outside-off', false);
create temp table held on commit drop as
  select pgfence_test.lease('restore-me', 'owner-old') as lease_id;
create temp table before on commit drop as
  select resource, enabled from pgfence.resource_status;

create temp table w on commit drop as
  select pgfence.prepare_update(array['restore-me', 'keep-off', 'op-on', 'op-off', 'op-off-again'], gen_random_uuid()) as token;
select is(pgfence.set_enabled('op-on', true), false, 'inside the window the operator enables op-on');
select is(pgfence.set_enabled('op-off', false), false, 'and disables op-off, which the window had disabled already');
select is(pgfence.set_enabled('op-off-again', false), false, 'and disables op-off-again, disabled before and inside the window');
select is(pgfence.release((select lease_id from held)), true, 'the drained owner releases');

-- The first finish.
create temp table first_finish on commit drop as
  select * from pgfence.finish_update((select token from w));
select results_eq($$ select resource, enabled, outcome from first_finish order by resource $$,
                  $$ values ('keep-off'::text, false, 'kept_disabled'::text),
                            ('op-off', false, 'conflict'),
                            ('op-off-again', false, 'conflict'),
                            ('op-on', true, 'conflict'),
                            ('restore-me', true, 'restored') $$,
                  'finish reports each resource: restored, kept_disabled, or conflict where the operator set enabled');
select results_eq($$ select s.resource, s.enabled from pgfence.resource_status s
                     where s.resource in ('restore-me', 'keep-off') order by s.resource $$,
                  $$ select resource, enabled from before where resource in ('restore-me', 'keep-off') order by resource $$,
                  'the resources nobody touched have exactly their enabled from before the window');
select results_eq($$ select resource, enabled from pgfence.resource_status
                     where resource in ('op-on', 'op-off', 'op-off-again') order by resource $$,
                  $$ values ('op-off'::text, false), ('op-off-again', false), ('op-on', true) $$,
                  'a conflict leaves enabled as the operator set it, to true or to false');
select is_empty($$ select b.resource from before b join pgfence.resource_status s using (resource)
                    where not b.enabled and s.enabled and b.resource <> 'op-on' $$,
                'nothing disabled before the window is enabled, except what the operator enabled explicitly (I6)');
select results_eq($$ select resource, enabled from pgfence.resource_status where resource like 'outside-%' order by resource $$,
                  $$ values ('outside-off'::text, false), ('outside-on', true) $$,
                  'resources outside the window are untouched');
select is_empty(format('select * from pgfence.open_updates where token = %L', (select token from w)),
                'open_updates no longer lists the token');
select results_eq($$ select resource, saved_enabled, enabled, verdict from pgfence.update_status((select token from w)) $$,
                  $$ values ('keep-off'::text, false, false, 'finished'::text), ('op-off', true, false, 'finished'),
                            ('op-off-again', false, false, 'finished'), ('op-on', false, true, 'finished'),
                            ('restore-me', true, true, 'finished') $$,
                  'update_status still answers, with the verdict finished');
select results_eq($$ select resource, open_update from pgfence.resource_status order by resource $$,
                  $$ select resource, null::uuid from before order by resource $$,
                  'no resource is in an open window any more');
select isnt((pgfence.acquire('restore-me', 'owner-new', '30 seconds')).lease_id, null,
            'a new worker acquires a restored resource');
select throws_ok($$ select pgfence.acquire('keep-off', 'owner-new', '30 seconds') $$, 'PF003', null,
                 'a resource kept disabled still refuses workers');

-- A second finish: already_finished everywhere, nothing changed.
create temp table after_first on commit drop as
  select resource, enabled from pgfence.resource_status;
select results_eq($$ select resource, enabled, outcome from pgfence.finish_update((select token from w)) $$,
                  $$ values ('keep-off'::text, false, 'already_finished'::text), ('op-off', false, 'already_finished'),
                            ('op-off-again', false, 'already_finished'), ('op-on', true, 'already_finished'),
                            ('restore-me', true, 'already_finished') $$,
                  'a second finish returns already_finished for every resource');
select results_eq($$ select resource, enabled from pgfence.resource_status order by resource $$,
                  $$ select resource, enabled from after_first order by resource $$,
                  'and changes no enabled');
select results_eq($$ select resource, outcome from pgfence.update_items
                     where token = (select token from w) order by resource $$,
                  $$ values ('keep-off'::text, 'kept_disabled'::text), ('op-off', 'conflict'), ('op-off-again', 'conflict'),
                            ('op-on', 'conflict'), ('restore-me', 'restored') $$,
                  'the window keeps the outcomes of the first finish');

-- After the operator disables a restored resource, a late finish does not enable it again.
select pgfence.set_enabled('restore-me', false);
select results_eq($$ select enabled, outcome from pgfence.finish_update((select token from w)) where resource = 'restore-me' $$,
                  $$ values (false, 'already_finished'::text) $$,
                  'a late finish leaves a resource the operator disabled afterwards disabled');
select is((select enabled from pgfence.resource_status where resource = 'restore-me'), false, 'it stays disabled');
select pgfence.set_enabled('restore-me', true);

-- The same resources in a new window; the old finish cannot undo it.
create temp table w2 on commit drop as
  select pgfence.prepare_update(array['restore-me', 'keep-off', 'op-on', 'op-off', 'op-off-again'], gen_random_uuid()) as token;
select isnt((select token from w2), (select token from w), 'after finish the resources can be put in a new window');
select results_eq($$ select resource, saved_enabled, enabled from pgfence.update_status((select token from w2)) $$,
                  $$ values ('keep-off'::text, false, false), ('op-off', false, false), ('op-off-again', false, false),
                            ('op-on', true, false), ('restore-me', true, false) $$,
                  'the new window saved the values as they are now');
select results_eq($$ select token from pgfence.open_updates $$, $$ select token from w2 $$,
                  'open_updates lists only the new window');
select is_empty($$ select * from pgfence.finish_update((select token from w)) where outcome <> 'already_finished' $$,
                'finishing the old window again is already_finished everywhere');
select results_eq($$ select resource, enabled, open_update from pgfence.resource_status
                     where resource not like 'outside-%' order by resource $$,
                  $$ values ('keep-off'::text, false, (select token from w2)), ('op-off', false, (select token from w2)),
                            ('op-off-again', false, (select token from w2)), ('op-on', false, (select token from w2)),
                            ('restore-me', false, (select token from w2)) $$,
                  'the old finish did not undo the new window''s pause');
select is((select status from pgfence.lease_status where owner = 'owner-new'), 'draining',
          'the new window drained the new worker''s lease');
select results_eq($$ select resource, enabled, outcome from pgfence.finish_update((select token from w2)) $$,
                  $$ values ('keep-off'::text, false, 'kept_disabled'::text), ('op-off', false, 'kept_disabled'),
                            ('op-off-again', false, 'kept_disabled'), ('op-on', true, 'restored'),
                            ('restore-me', true, 'restored') $$,
                  'the new window''s finish restores its own saved values');
select is_empty($$ select * from pgfence.open_updates $$, 'no window is open');

-- Refused tokens: nothing changed.
create temp table settled on commit drop as
  select resource, enabled from pgfence.resource_status;
select throws_ok(format('select * from pgfence.finish_update(%L)', gen_random_uuid()), 'PF005', null,
                 'an unknown token is refused');
select throws_like(format('select * from pgfence.finish_update(%L)', '00000000-0000-4000-8000-000000000000'),
                   '%update ref ' || pgfence.ref('00000000-0000-4000-8000-000000000000') || ' does not exist%',
                   'the error names the unknown token by its digest, never the token (a capability)');
select throws_ok($$ select * from pgfence.finish_update(null) $$, '22023', null, 'a NULL token is refused');
select throws_like($$ select * from pgfence.finish_update(null) $$, '%token%', 'the error names the token argument');
select results_eq($$ select resource, enabled from pgfence.resource_status order by resource $$,
                  $$ select resource, enabled from settled order by resource $$,
                  'the refused calls changed no enabled');
select is_empty($$ select * from pgfence.open_updates $$, 'and opened nothing');

select * from finish();
rollback;

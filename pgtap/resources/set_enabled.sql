-- set_enabled: the operator's switch; returns the previous value; changes nothing on error.
begin;
select plan(16);
select pgfence_test.reset();
select pgfence.register('r');

select is(pgfence.set_enabled('r', false), true, 'disabling an enabled resource returns true, the previous value');
select is((select enabled from pgfence.resource_status where resource = 'r'), false, 'the resource is disabled');
select is(pgfence.set_enabled('r', false), false, 'disabling it again returns false');
select is((select enabled from pgfence.resource_status where resource = 'r'), false, 'it stays disabled');
select is(pgfence.set_enabled('r', true), false, 'enabling a disabled resource returns false, the previous value');
select is((select enabled from pgfence.resource_status where resource = 'r'), true, 'the resource is enabled');
select is(pgfence.set_enabled('r', true), true, 'enabling it again returns true');

select throws_ok($$ select pgfence.set_enabled('unknown', true) $$, 'PF002', null,
                 'an unknown resource is refused');
select is_empty($$ select resource from pgfence.resource_status where resource = 'unknown' $$,
                'set_enabled does not register an unknown resource');

select throws_ok($$ select pgfence.set_enabled(null, false) $$, '22023', null, 'a NULL name is refused');
select throws_ok($$ select pgfence.set_enabled('', false) $$, '22023', null, 'an empty name is refused');
select throws_ok($$ select pgfence.set_enabled('r r', false) $$, '22023', null, 'a name with a space is refused');
select throws_ok(format('select pgfence.set_enabled(%L, false)', repeat('r', 129)), '22023', null,
                 'a 129-character name is refused');
select throws_ok($$ select pgfence.set_enabled('r', null) $$, '22023', null, 'a NULL enabled is refused');
select throws_like($$ select pgfence.set_enabled('r', null) $$, '%enabled%', 'the error names the enabled argument');
select results_eq($$ select resource, enabled from pgfence.resource_status $$,
                  $$ values ('r'::text, true) $$,
                  'refused calls changed nothing');

select * from finish();
rollback;

-- register: idempotent, never changes an existing resource's enabled (I6), refuses bad input.
begin;
select plan(25);
select pgfence_test.reset();

select lives_ok($$ select pgfence.register('r') $$, 'a new resource registers');
select results_eq($$ select resource, enabled from pgfence.resource_status $$,
                  $$ values ('r'::text, true) $$,
                  'it is listed, enabled by default');
select lives_ok($$ select pgfence.register('r') $$, 'registering it again is fine');
select is((select count(*) from pgfence.resource_status where resource = 'r'), 1::bigint,
          'registering twice still gives one resource');

-- I6: registration never enables anything, and never disables anything either.
select lives_ok($$ select pgfence.register('paused', false) $$, 'a resource can be registered disabled');
select is((select enabled from pgfence.resource_status where resource = 'paused'), false,
          'it is disabled');
select lives_ok($$ select pgfence.register('paused', true) $$, 'registering it again asking for enabled is fine');
select is((select enabled from pgfence.resource_status where resource = 'paused'), false,
          'registering again does not enable a disabled resource');
select lives_ok($$ select pgfence.register('paused') $$, 'registering it again with the default is fine');
select is((select enabled from pgfence.resource_status where resource = 'paused'), false,
          'the default enabled does not enable a disabled resource either');
select lives_ok($$ select pgfence.register('r', false) $$, 'registering an enabled resource asking for disabled is fine');
select is((select enabled from pgfence.resource_status where resource = 'r'), true,
          'registering again does not disable an enabled resource');

-- Names at the edge of what is allowed.
select lives_ok(format('select pgfence.register(%L)', repeat('a', 128)), 'a 128-character name is accepted');
select lives_ok($$ select pgfence.register('fn_1.shard:eu@host/part-2') $$,
                'a name with the allowed punctuation is accepted');

-- Bad input: 22023, and nothing registered.
select throws_ok($$ select pgfence.register(null) $$, '22023', null, 'a NULL name is refused');
select throws_ok($$ select pgfence.register('') $$, '22023', null, 'an empty name is refused');
select throws_ok(format('select pgfence.register(%L)', repeat('a', 129)), '22023', null,
                 'a 129-character name is refused');
select throws_ok($$ select pgfence.register('my resource') $$, '22023', null, 'a name with a space is refused');
select throws_ok($$ select pgfence.register('-r') $$, '22023', null, 'a name starting with a dash is refused');
select throws_ok($$ select pgfence.register(E'r\n') $$, '22023', null, 'a name ending in a newline is refused');
select throws_ok($$ select pgfence.register('nothing', null) $$, '22023', null, 'a NULL enabled is refused');
select throws_like($$ select pgfence.register('-r') $$, '%resource%', 'the error names the resource argument');
select throws_like($$ select pgfence.register('nothing', null) $$, '%enabled%', 'the error names the enabled argument');
select is_empty($$ select resource from pgfence.resource_status
                    where resource not in ('r', 'paused', 'fn_1.shard:eu@host/part-2')
                      and resource <> repeat('a', 128) $$,
                'no refused call registered anything');
select results_eq($$ select resource, enabled from pgfence.resource_status where resource in ('r', 'paused') order by resource $$,
                  $$ values ('paused'::text, false), ('r'::text, true) $$,
                  'refused calls changed nothing');

select * from finish();
rollback;

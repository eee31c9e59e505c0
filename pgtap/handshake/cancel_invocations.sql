-- cancel_invocations: the operator ends a resource's pending startup invocations, so that a
-- start that never happened does not hold off the next one until it expires.
begin;
select plan(10);
select pgfence_test.reset();
select pgfence.register('r');
select pgfence.register('other');
select pgfence.request_start('r', '1 day') as pending \gset
select pgfence.request_start('other', '1 day') as elsewhere \gset

select is(pgfence.request_start('r'), null, 'a pending invocation holds off a second start');
select is(pgfence.cancel_invocations('r'), 1, 'cancel_invocations ends the one pending invocation');
select isnt(pgfence.request_start('r'), null, 'and a new start may be requested');
select is((select pending_invocations from pgfence.resource_status where resource = 'other'), 1::bigint,
          'another resource''s invocation is untouched');
select is(pgfence.cancel_invocations('r'), 1, 'it ends the newer one too, when asked again');
select is(pgfence.cancel_invocations('r'), 0, 'nothing pending: 0');
select lives_ok(format($$ select pgfence.acquire('r', 'late', '30 seconds', %L) $$, :'pending'),
                'a late acquire presenting a cancelled invocation is still accepted (it grants nothing by itself)');
select pgfence.acquire('other', 'started', '30 seconds', :'elsewhere');
select is(pgfence.cancel_invocations('other'), 0, 'an acknowledged invocation is not pending: nothing to cancel');
select throws_ok($$ select pgfence.cancel_invocations('nope') $$, 'PF002', null, 'an unknown resource: PF002');
select throws_ok($$ select pgfence.cancel_invocations(null) $$, '22023', null, 'NULL: 22023');

select * from finish();
rollback;

-- deprecate: the operator turns the active lease into a draining one and gets its id back.
begin;
select plan(18);
select pgfence_test.reset();
select pgfence.register('r');

create temp table held on commit drop as
  select * from pgfence.acquire('r', 'owner-a', '30 seconds');
select is(pgfence.deprecate('r'), (select lease_id from held), 'deprecate returns the active lease''s id');
select is((select status from pgfence.lease_status where resource = 'r'), 'draining', 'that lease is now draining');
select is((select draining_leases from pgfence.resource_status where resource = 'r'), 1::bigint,
          'resource_status counts it as draining');
select is((select enabled from pgfence.resource_status where resource = 'r'), true, 'deprecate leaves enabled alone');
select is(pgfence.deprecate('r'), null, 'deprecating again returns NULL: no lease is active');
-- What the CLI shows of that NULL: no reference at all, not one that looks real.
select is(pgfence.ref(pgfence.deprecate('r')), null, 'no lease, no reference (ref)');
select is(pgfence.capability_ref(null), null, 'no id, no reference (capability_ref)');
select is((select state from pgfence.renew((select lease_id from held), '30 seconds')), 'draining',
          'the deprecated owner keeps its heartbeat as draining');
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from held)), 'PF001', null,
                 'the deprecated lease cannot fence');

create temp table successor on commit drop as
  select * from pgfence.acquire('r', 'owner-b', '30 seconds');
select isnt((select lease_id from successor), null, 'a successor acquires at once');
select ok((select s.generation > h.generation from successor s, held h), 'with a greater generation');
select is(pgfence.deprecate('r'), (select lease_id from successor), 'deprecating again returns the successor''s id');
select is((select count(*) from pgfence.lease_status where resource = 'r' and status = 'draining'), 2::bigint,
          'both leases are draining');

select pgfence.register('idle');
select is(pgfence.deprecate('idle'), null, 'deprecating a resource that never had a lease returns NULL');

select throws_ok($$ select pgfence.deprecate('unknown') $$, 'PF002', null, 'an unknown resource is refused');
select throws_ok($$ select pgfence.deprecate(null) $$, '22023', null, 'a NULL name is refused');
select throws_ok($$ select pgfence.deprecate('') $$, '22023', null, 'an empty name is refused');
select throws_ok($$ select pgfence.deprecate('r r') $$, '22023', null, 'a name with a space is refused');

select * from finish();
rollback;

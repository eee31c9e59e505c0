-- drain: the owner stops claiming; the resource is free for a successor at once.
begin;
select plan(20);
select pgfence_test.reset();

select pgfence.register('r');
create temp table held on commit drop as
  select * from pgfence.acquire('r', 'owner-a', '30 seconds');

select is(pgfence.drain((select lease_id from held)), 'draining', 'draining an active lease returns draining');
select is((select status from pgfence.lease_status where resource = 'r'), 'draining', 'lease_status shows it draining');
select is(pgfence.drain((select lease_id from held)), 'draining', 'draining it again returns draining');
select is((select count(*) from pgfence.lease_status where resource = 'r'), 1::bigint, 'draining twice mints no lease');
select is((select draining_leases from pgfence.resource_status where resource = 'r'), 1::bigint,
          'resource_status counts the draining lease');
select is((select owner from pgfence.resource_status where resource = 'r'), null,
          'the resource has no current owner');

-- The resource is free for a successor at once.
create temp table successor on commit drop as
  select * from pgfence.acquire('r', 'owner-b', '30 seconds');
select isnt((select lease_id from successor), null, 'a successor acquires at once');
select ok((select s.generation > h.generation from successor s, held h),
          'with a greater generation');
select is((select status from pgfence.lease_status l join held h using (generation)), 'draining',
          'the drained lease stays draining, not superseded');

-- A draining lease may finish its work but never fence a write.
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from held)), 'PF001', null,
                 'a drained lease cannot fence');
select is(pgfence.drain((select lease_id from held)), 'draining', 'draining it again after the takeover is fine');
select is((select status from pgfence.lease_status l join successor s using (generation)), 'current',
          'the successor is still current');

-- Leases that are not current.
create temp table superseded on commit drop as
  select pgfence_test.superseded_lease('s') as lease_id;
select throws_ok(format('select pgfence.drain(%L)', (select lease_id from superseded)), 'PF001', null,
                 'a superseded lease cannot drain');
select is((select status from pgfence.lease_status where resource = 's' and owner = 'successor'), 'current',
          'the successor of the superseded lease is still current');

create temp table released on commit drop as
  select pgfence_test.lease('x', 'owner-x') as lease_id;
select pgfence.release(lease_id) from released;
select throws_ok(format('select pgfence.drain(%L)', (select lease_id from released)), 'PF001', null,
                 'a released lease cannot drain');
select is((select status from pgfence.lease_status where resource = 'x'), 'released', 'it stays released');

create temp table expired on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence_test.expire(lease_id) from expired;
select throws_ok(format('select pgfence.drain(%L)', (select lease_id from expired)), 'PF001', null,
                 'an expired lease cannot drain');
select is((select status from pgfence.lease_status where resource = 'e'), 'stale', 'it stays stale');

select throws_ok(format('select pgfence.drain(%L)', gen_random_uuid()), 'PF001', null, 'an unknown lease id cannot drain');
select throws_ok($$ select pgfence.drain(null) $$, '22023', null, 'a NULL lease id is refused');

select * from finish();
rollback;

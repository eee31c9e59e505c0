-- fence: returns the generation of the resource's current lease; PF001 for any lease that
-- is not current.
begin;
select plan(14);
select pgfence_test.reset();
select pgfence.register('r');

create temp table held on commit drop as
  select * from pgfence.acquire('r', 'owner-a', '30 seconds');
select is(pgfence.fence((select lease_id from held)), (select generation from held),
          'fencing the current lease returns its generation');
select is(pgfence.fence((select lease_id from held)), (select generation from held),
          'fencing it again in the same transaction returns the same generation');
select lives_ok(format('select pgfence.fence(%L)', (select lease_id from held)),
                'fencing a third time in the same transaction is fine');
select is((select status from pgfence.lease_status where resource = 'r'), 'current',
          'fencing leaves the lease current');
select is((select count(*) from pgfence.lease_status where resource = 'r'), 1::bigint,
          'fencing mints no lease');

create temp table expired on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence_test.expire(lease_id) from expired;
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from expired)), 'PF001', null,
                 'an expired lease cannot fence');

create temp table superseded on commit drop as
  select pgfence_test.superseded_lease('s') as lease_id;
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from superseded)), 'PF001', null,
                 'a superseded lease cannot fence');
select is(pgfence.fence(pgfence_test.active_lease('s')),
          (select generation from pgfence.lease_status where resource = 's' and owner = 'successor'),
          'its successor fences with its own generation');
select ok((select s.generation > p.generation
             from pgfence.lease_status s, pgfence.lease_status p
            where s.resource = 's' and s.owner = 'successor' and p.resource = 's' and p.owner = 'predecessor'),
          'the successor''s generation is greater than the superseded one''s');

create temp table released on commit drop as
  select pgfence_test.lease('x', 'owner-x') as lease_id;
select pgfence.release(lease_id) from released;
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from released)), 'PF001', null,
                 'a released lease cannot fence');

create temp table draining on commit drop as
  select pgfence_test.lease('d', 'owner-d') as lease_id;
select pgfence.drain(lease_id) from draining;
select throws_ok(format('select pgfence.fence(%L)', (select lease_id from draining)), 'PF001', null,
                 'a draining lease cannot fence');

select throws_ok(format('select pgfence.fence(%L)', gen_random_uuid()), 'PF001', null, 'an unknown lease id cannot fence');
select throws_ok($$ select pgfence.fence(null) $$, '22023', null, 'a NULL lease id is refused');

select is(pgfence.fence((select lease_id from held)), (select generation from held),
          'the current lease still fences after the others were refused');

select * from finish();
rollback;

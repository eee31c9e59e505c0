-- release: true if this call ended the lease, false if it had already ended; never touches
-- another lease (I4); generations keep increasing across release (I3).
begin;
select plan(18);
select pgfence_test.reset();
select pgfence.register('r');

create temp table held on commit drop as
  select * from pgfence.acquire('r', 'owner-a', '30 seconds');
select is(pgfence.release((select lease_id from held)), true, 'releasing a current lease returns true');
select is((select status from pgfence.lease_status where resource = 'r'), 'released', 'lease_status shows it released');
select isnt((select ended_at from pgfence.lease_status where resource = 'r'), null, 'the released lease has an end time');
select is(pgfence.release((select lease_id from held)), false, 'releasing it again returns false');
select is((select owner from pgfence.resource_status where resource = 'r'), null, 'the resource has no current owner');

-- The resource is free for a successor, with a higher generation.
create temp table successor on commit drop as
  select * from pgfence.acquire('r', 'owner-b', '30 seconds');
select isnt((select lease_id from successor), null, 'a successor acquires the released resource');
select ok((select s.generation > h.generation from successor s, held h), 'with a greater generation');
select is(pgfence.release((select lease_id from held)), false, 'the released lease releasing again after the takeover returns false');
select is((select status from pgfence.lease_status l join successor s using (generation)), 'current',
          'the successor stays current');

-- I4: a superseded lease's release changes nothing of its successor.
create temp table superseded on commit drop as
  select pgfence_test.superseded_lease('s') as lease_id;
create temp table successor_before on commit drop as
  select owner, status, generation, expires_at, ended_at from pgfence.lease_status where resource = 's' and owner = 'successor';
select is(pgfence.release((select lease_id from superseded)), false, 'releasing a superseded lease returns false');
select results_eq($$ select owner, status, generation, expires_at, ended_at from pgfence.lease_status
                      where resource = 's' and owner = 'successor' $$,
                  $$ select * from successor_before $$,
                  'the successor stays current, untouched');
select is((select status from pgfence.lease_status where resource = 's' and owner = 'predecessor'), 'superseded',
          'the superseded lease stays superseded');

-- A draining lease can be released too.
create temp table draining on commit drop as
  select pgfence_test.lease('d', 'owner-d') as lease_id;
select pgfence.drain(lease_id) from draining;
select is(pgfence.release((select lease_id from draining)), true, 'releasing a draining lease returns true');
select is((select status from pgfence.lease_status where resource = 'd'), 'released', 'it is released');
select is((select draining_leases from pgfence.resource_status where resource = 'd'), 0::bigint,
          'the resource has no draining lease left');

-- Each release then re-acquire keeps the generations increasing.
select pgfence.release(lease_id) from successor;
select ok((pgfence.acquire('r', 'owner-c', '30 seconds')).generation > (select generation from successor),
          'the next lease after another release has a greater generation still');

select throws_ok(format('select pgfence.release(%L)', gen_random_uuid()), 'PF001', null, 'an unknown lease id is refused');
select throws_ok($$ select pgfence.release(null) $$, '22023', null, 'a NULL lease id is refused');

select * from finish();
rollback;

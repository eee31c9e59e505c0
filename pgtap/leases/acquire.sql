-- acquire: grants the next generation when no lease is current, NULL while one is, supersedes
-- a stale one; refuses unknown and disabled resources and bad arguments, changing nothing.
begin;
select plan(39);
select pgfence_test.reset();
select pgfence.register('r');

-- The first acquire gets a lease.
create temp table first_lease on commit drop as
  select * from pgfence.acquire('r', 'owner-a', '30 seconds');
select isnt((select lease_id from first_lease), null, 'the first acquire gets a lease id');
select is((select resource from first_lease), 'r', 'the lease is for the resource asked for');
select isnt((select generation from first_lease), null, 'the lease has a generation');
select ok((select expires_at > clock_timestamp() + interval '25 seconds'
                 and expires_at <= clock_timestamp() + interval '30 seconds' from first_lease),
          'the lease expires about ttl from now');
select results_eq($$ select owner, status, generation from pgfence.lease_status $$,
                  $$ select 'owner-a'::text, 'current'::text, generation from first_lease $$,
                  'lease_status shows it current, with its owner and generation');

-- While it is current, nobody else gets one.
select ok(pgfence.acquire('r', 'owner-b', '30 seconds') is null, 'a second acquire while the lease is current returns NULL');
select ok(pgfence.acquire('r', 'owner-a', '30 seconds') is null, 'the same owner does not get a second lease either');
select is((select count(*) from pgfence.lease_status where resource = 'r'), 1::bigint,
          'a refused acquire records no lease');

-- Once it has expired, the next acquire supersedes it.
select pgfence_test.expire(lease_id) from first_lease;
create temp table second_lease on commit drop as
  select * from pgfence.acquire('r', 'owner-b', '30 seconds');
select isnt((select lease_id from second_lease), null, 'after expiry the next acquire gets a lease');
select isnt((select lease_id from second_lease), (select lease_id from first_lease), 'with a new lease id');
select ok((select s.generation > f.generation from first_lease f, second_lease s),
          'and a strictly greater generation');
select is((select status from pgfence.lease_status l join first_lease f using (generation)), 'superseded',
          'the expired lease shows as superseded');
select is((select status from pgfence.lease_status l join second_lease s using (generation)), 'current',
          'the new lease shows as current');
select isnt((select ended_at from pgfence.lease_status l join first_lease f using (generation)), null,
            'the superseded lease has an end time');
select results_eq($$ select owner, generation from pgfence.resource_status where resource = 'r' $$,
                  $$ select 'owner-b'::text, generation from second_lease $$,
                  'resource_status shows the new owner and generation');

-- Unknown and disabled resources.
select throws_ok($$ select pgfence.acquire('unknown', 'owner-a', '30 seconds') $$, 'PF002', null,
                 'acquiring an unknown resource is refused');
select pgfence.register('paused', false);
select throws_ok($$ select pgfence.acquire('paused', 'owner-a', '30 seconds') $$, 'PF003', null,
                 'acquiring a disabled resource is refused');
select is_empty($$ select generation from pgfence.lease_status where resource in ('unknown', 'paused') $$,
                'no lease was granted for an unknown or disabled resource');

-- An expired lease nobody superseded yet is stale: shown, but it authorizes nothing.
create temp table stale_lease on commit drop as
  select pgfence_test.lease('s', 'owner-s') as lease_id;
select pgfence_test.expire(lease_id) from stale_lease;
select is((select status from pgfence.lease_status where resource = 's'), 'stale',
          'an expired lease nobody superseded shows as stale in lease_status');
select is((select stale from pgfence.resource_status where resource = 's'), true,
          'resource_status marks the resource stale');
select is((select owner from pgfence.resource_status where resource = 's'), 'owner-s',
          'resource_status still names the stale owner');

-- Bad arguments: 22023, and the stale lease is not superseded by a refused call.
select throws_ok($$ select pgfence.acquire(null, 'owner-b', '30 seconds') $$, '22023', null, 'a NULL resource is refused');
select throws_ok($$ select pgfence.acquire('', 'owner-b', '30 seconds') $$, '22023', null, 'an empty resource is refused');
select throws_ok($$ select pgfence.acquire('s', '', '30 seconds') $$, '22023', null, 'an empty owner is refused');
select throws_ok($$ select pgfence.acquire('s', null, '30 seconds') $$, '22023', null, 'a NULL owner is refused');
select throws_ok(format('select pgfence.acquire(%L, %L, %L)', 's', repeat('o', 257), '30 seconds'), '22023', null,
                 'a 257-character owner is refused');
select throws_ok($$ select pgfence.acquire('s', E'owner\nb', '30 seconds') $$, '22023', null,
                 'an owner containing a newline is refused');
select throws_ok($$ select pgfence.acquire('s', 'owner-b', '0 seconds') $$, '22023', null, 'a zero ttl is refused');
select throws_ok($$ select pgfence.acquire('s', 'owner-b', '-30 seconds') $$, '22023', null, 'a negative ttl is refused');
select throws_ok($$ select pgfence.acquire('s', 'owner-b', '2 days') $$, '22023', null, 'a ttl of two days is refused');
select throws_ok($$ select pgfence.acquire('s', 'owner-b', null) $$, '22023', null, 'a NULL ttl is refused');
select throws_ok($$ select pgfence.acquire('s', 'owner-b', '30 seconds', gen_random_uuid()) $$, '22023', null,
                 'an unknown invocation id is refused');
select throws_like($$ select pgfence.acquire('s', '', '30 seconds') $$, '%owner%', 'the error names the owner argument');
select throws_like($$ select pgfence.acquire('s', 'owner-b', '2 days') $$, '%ttl%', 'the error names the ttl argument');
select results_eq($$ select owner, status from pgfence.lease_status where resource = 's' $$,
                  $$ values ('owner-s'::text, 'stale'::text) $$,
                  'refused calls neither superseded the stale lease nor granted a new one');

-- The edges of what is allowed.
select isnt((pgfence.acquire('s', repeat('o', 256), '1 day')).lease_id, null,
            'a 256-character owner and a one-day ttl are accepted, superseding the stale lease');
select is((select status from pgfence.lease_status where resource = 's' and owner = 'owner-s'), 'superseded',
          'the stale lease is now superseded');
select is_empty($$ select resource from pgfence.lease_status where status in ('current', 'stale')
                    group by resource having count(*) > 1 $$,
                'no resource has two leases that are current or stale');
select is((select count(*) from pgfence.lease_status where status = 'current'), 2::bigint,
          'exactly one current lease for each of the two held resources');

select * from finish();
rollback;

-- renew: extends an active or draining, unexpired lease; safe to retry; expiry is final.
begin;
select plan(26);
select pgfence_test.reset();

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-a', '10 seconds') as lease_id;

-- Renewal extends the lease.
create temp table renewed on commit drop as
  select * from pgfence.renew((select lease_id from held), '1 minute');
select is((select state from renewed), 'active', 'renewing an active lease returns state active');
select ok((select expires_at > clock_timestamp() + interval '55 seconds'
                 and expires_at <= clock_timestamp() + interval '1 minute' from renewed),
          'the new expiry is about ttl from now');
select is((select expires_at from pgfence.lease_status where resource = 'r'), (select expires_at from renewed),
          'lease_status shows the returned expiry');
select isnt((select renewed_at from pgfence.lease_status where resource = 'r'), null,
            'lease_status records the renewal');
select is((select status from pgfence.lease_status where resource = 'r'), 'current', 'the lease is still current');

-- A retry after a lost response is safe.
create temp table renewed_again on commit drop as
  select * from pgfence.renew((select lease_id from held), '1 minute');
select is((select state from renewed_again), 'active', 'renewing again returns state active');
select ok((select a.expires_at >= r.expires_at from renewed r, renewed_again a),
          'renewing again never moves the expiry back');
select is((select count(*) from pgfence.lease_status where resource = 'r'), 1::bigint,
          'renewing mints no new lease');

-- Bad arguments: 22023, the lease unchanged.
select throws_ok($$ select pgfence.renew(null, '1 minute') $$, '22023', null, 'a NULL lease id is refused');
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from held), '0 seconds'), '22023', null,
                 'a zero ttl is refused');
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from held), '-1 minute'), '22023', null,
                 'a negative ttl is refused');
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from held), '2 days'), '22023', null,
                 'a ttl of two days is refused');
select throws_ok(format('select pgfence.renew(%L, null)', (select lease_id from held)), '22023', null,
                 'a NULL ttl is refused');
select is((select expires_at from pgfence.lease_status where resource = 'r'), (select expires_at from renewed_again),
          'refused renewals left the expiry as it was');

-- A draining owner keeps its heartbeat while it finishes.
create temp table draining on commit drop as
  select pgfence_test.lease('d', 'owner-d') as lease_id;
select pgfence.drain(lease_id) from draining;
select is((select state from pgfence.renew((select lease_id from draining), '1 minute')), 'draining',
          'renewing a draining lease returns state draining');
select is((select status from pgfence.lease_status where resource = 'd'), 'draining',
          'a renewed draining lease stays draining');

-- Expiry is final: a late renewal does not bring a lease back.
create temp table expired on commit drop as
  select pgfence_test.lease('e', 'owner-e') as lease_id;
select pgfence_test.expire(lease_id) from expired;
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from expired), '1 minute'), 'PF001', null,
                 'an expired lease cannot renew');
select is((select status from pgfence.lease_status where resource = 'e'), 'stale',
          'the expired lease stays expired');
select ok((select expires_at <= clock_timestamp() from pgfence.lease_status where resource = 'e'),
          'its expiry did not move');
select pgfence_test.expire(lease_id) from draining;
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from draining), '1 minute'), 'PF001', null,
                 'an expired draining lease cannot renew');

-- Superseded, released and unknown leases.
create temp table successor on commit drop as
  select pgfence_test.superseded_lease('s') as old_id;
create temp table successor_before on commit drop as
  select expires_at, generation from pgfence.lease_status where resource = 's' and status = 'current';
select throws_ok(format('select pgfence.renew(%L, %L)', (select old_id from successor), '1 minute'), 'PF001', null,
                 'a superseded lease cannot renew');
select results_eq($$ select status, expires_at, generation from pgfence.lease_status where resource = 's' and owner = 'successor' $$,
                  $$ select 'current'::text, expires_at, generation from successor_before $$,
                  'the successor is untouched by its predecessor''s renewal');
select is((select status from pgfence.lease_status where resource = 's' and owner = 'predecessor'), 'superseded',
          'the superseded lease stays superseded');

create temp table released on commit drop as
  select pgfence_test.lease('x', 'owner-x') as lease_id;
select pgfence.release(lease_id) from released;
select throws_ok(format('select pgfence.renew(%L, %L)', (select lease_id from released), '1 minute'), 'PF001', null,
                 'a released lease cannot renew');
select is((select status from pgfence.lease_status where resource = 'x'), 'released',
          'the released lease stays released');
select throws_ok(format('select pgfence.renew(%L, %L)', gen_random_uuid(), '1 minute'), 'PF001', null,
                 'an unknown lease id cannot renew');

select * from finish();
rollback;

-- request_start (startup handshake): a new invocation id only for an enabled resource with no
-- current lease and nothing pending, otherwise NULL; the acquire that presents it acknowledges
-- it, and an invocation never grants ownership by itself.
begin;
select plan(39);
select pgfence_test.reset();
select pgfence.register('r');

-- An enabled resource with no lease and nothing pending gets an invocation.
create temp table first_inv on commit drop as
  select pgfence.request_start('r') as invocation_id;
select isnt((select invocation_id from first_inv), null, 'request_start returns an invocation id');
select is((select pending_invocations from pgfence.resource_status where resource = 'r'), 1::bigint,
          'resource_status counts the pending invocation');
select ok((select i.expires_at > clock_timestamp() + interval '55 seconds'
                  and i.expires_at <= clock_timestamp() + interval '1 minute'
             from pgfence.invocations i join first_inv using (invocation_id)),
          'by default the invocation is pending for about a minute');

-- While it is pending: NULL.
select is(pgfence.request_start('r'), null, 'a second request while the invocation is pending returns NULL');
select is(pgfence.request_start('r', '1 day'), null, 'whatever its ttl');
select is((select pending_invocations from pgfence.resource_status where resource = 'r'), 1::bigint,
          'the refused requests added no invocation');

-- Once it expired, a new one.
select pgfence_test.expire_invocation(invocation_id) from first_inv;
select is((select pending_invocations from pgfence.resource_status where resource = 'r'), 0::bigint,
          'an expired invocation is no longer pending');
create temp table second_inv on commit drop as
  select pgfence.request_start('r', '5 minutes') as invocation_id;
select isnt((select invocation_id from second_inv), null, 'after the invocation expired, request_start returns an id');
select isnt((select invocation_id from second_inv), (select invocation_id from first_inv), 'a new one');

-- The acquire that presents it acknowledges it and gets the lease.
create temp table started on commit drop as
  select * from pgfence.acquire('r', 'worker-1', '30 seconds', (select invocation_id from second_inv));
select isnt((select lease_id from started), null, 'the acquire presenting the invocation is granted a lease');
select is((select status from pgfence.lease_status l join started using (generation)), 'current',
          'the lease is current');
select is((select pending_invocations from pgfence.resource_status where resource = 'r'), 0::bigint,
          'the invocation is acknowledged: nothing pending');
select results_eq($$ select i.acknowledged_at is not null, i.lease_id from pgfence.invocations i join second_inv using (invocation_id) $$,
                  $$ select true, lease_id from started $$,
                  'the invocation records its acknowledgement and the lease it led to');

-- While a lease is current: NULL.
select is(pgfence.request_start('r'), null, 'request_start while a lease is current returns NULL');
select is((select pending_invocations from pgfence.resource_status where resource = 'r'), 0::bigint,
          'and adds no invocation');

-- Once the lease is stale (expired, not yet superseded), a start may be requested.
select pgfence_test.expire(lease_id) from started;
select isnt(pgfence.request_start('r'), null, 'request_start for a resource whose lease expired returns an id');

-- Presenting an invocation while another lease is current: NULL, but acknowledged.
select pgfence.register('h');
create temp table h_inv on commit drop as
  select pgfence.request_start('h') as invocation_id;
create temp table h_owner on commit drop as
  select * from pgfence.acquire('h', 'someone-else', '30 seconds');
select isnt((select lease_id from h_owner), null, 'another owner acquires h without the invocation');
select is(pgfence.acquire('h', 'worker-h', '30 seconds', (select invocation_id from h_inv)), null,
          'presenting the invocation while another lease is current returns NULL: an invocation grants nothing');
select results_eq($$ select owner, status from pgfence.lease_status where resource = 'h' $$,
                  $$ values ('someone-else'::text, 'current'::text) $$,
                  'the other owner keeps the only lease');
select is((select pending_invocations from pgfence.resource_status where resource = 'h'), 0::bigint,
          'the invocation is acknowledged anyway');

-- A disabled resource: NULL.
select pgfence.register('off', false);
select is(pgfence.request_start('off'), null, 'request_start for a disabled resource returns NULL');
select is((select pending_invocations from pgfence.resource_status where resource = 'off'), 0::bigint,
          'and adds no invocation');

-- An invocation of another resource cannot be presented.
select pgfence.register('a');
select pgfence.register('b');
create temp table a_inv on commit drop as
  select pgfence.request_start('a') as invocation_id;
select throws_ok(format('select pgfence.acquire(%L, %L, %L, %L)', 'b', 'worker-b', '30 seconds', (select invocation_id from a_inv)),
                 '22023', null, 'presenting an invocation of another resource is refused');
select is_empty($$ select generation from pgfence.lease_status where resource = 'b' $$,
                'no lease was granted for it');
select is((select pending_invocations from pgfence.resource_status where resource = 'a'), 1::bigint,
          'the invocation of a is still pending');

-- Unknown resource and bad arguments.
create temp table inv_before on commit drop as
  select count(*) as n from pgfence.invocations;
select throws_ok($$ select pgfence.request_start('unknown') $$, 'PF002', null, 'an unknown resource is refused');
select throws_ok($$ select pgfence.request_start(null) $$, '22023', null, 'a NULL resource is refused');
select throws_ok($$ select pgfence.request_start('') $$, '22023', null, 'an empty resource is refused');
select throws_ok($$ select pgfence.request_start('has space') $$, '22023', null, 'a resource name with a space is refused');
select throws_ok($$ select pgfence.request_start('b', '0 seconds') $$, '22023', null, 'a zero ttl is refused');
select throws_ok($$ select pgfence.request_start('b', '2 days') $$, '22023', null, 'a ttl of two days is refused');
select throws_ok($$ select pgfence.request_start('b', null) $$, '22023', null, 'a NULL ttl is refused');
select throws_like($$ select pgfence.request_start('b', '0 seconds') $$, '%ttl%', 'the error names the ttl argument');
select is((select count(*) from pgfence.invocations), (select n from inv_before), 'the refused calls added no invocation');

-- The edge of what is allowed.
select isnt(pgfence.request_start('b', '1 day'), null, 'a one-day ttl is accepted');

-- An invocation grants at most one lease: its request replayed after that lease ended (released
-- or expired) starts nobody, though the resource is free for an acquire without it.
select pgfence.register('replay');
create temp table replay_inv on commit drop as
  select pgfence.request_start('replay') as invocation_id;
create temp table replay_first on commit drop as
  select * from pgfence.acquire('replay', 'worker-1', '30 seconds', (select invocation_id from replay_inv));
select pgfence.release(lease_id) from replay_first;
select is(pgfence.acquire('replay', 'worker-2', '30 seconds', (select invocation_id from replay_inv)), null,
          'the invocation replayed after its lease was released grants nothing');
create temp table replay_second on commit drop as
  select * from pgfence.acquire('replay', 'worker-3', '30 seconds');
select isnt((select lease_id from replay_second), null, 'the free resource is acquired without it');
select pgfence_test.expire(lease_id) from replay_second;
select is(pgfence.acquire('replay', 'worker-4', '30 seconds', (select invocation_id from replay_inv)), null,
          'nor after a later lease expired');
select results_eq($$ select i.lease_id from pgfence.invocations i join replay_inv using (invocation_id) $$,
                  $$ select lease_id from replay_first $$,
                  'the invocation still names the one lease it led to');

select * from finish();
rollback;

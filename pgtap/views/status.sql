-- resource_status and lease_status: what an operator sees of each resource and each lease.
begin;
select plan(22);
select pgfence_test.reset();

select pgfence.register('held');
create temp table held on commit drop as
  select * from pgfence.acquire('held', 'owner-held', '30 seconds');
create temp table stale on commit drop as
  select pgfence_test.lease('stale', 'owner-stale') as lease_id;
select pgfence_test.expire(lease_id) from stale;
create temp table deprecated on commit drop as
  select pgfence_test.lease('deprecated', 'owner-deprecated') as lease_id;
select pgfence.deprecate('deprecated');
create temp table released on commit drop as
  select pgfence_test.lease('released', 'owner-released') as lease_id;
select pgfence.release(lease_id) from released;
select pgfence_test.superseded_lease('superseded');
select pgfence.register('idle', false);

-- resource_status: one row per resource.
select results_eq($$ select resource from pgfence.resource_status order by resource $$,
                  $$ values ('deprecated'::text), ('held'), ('idle'), ('released'), ('stale'), ('superseded') $$,
                  'resource_status has one row per resource');
select results_eq($$ select owner, generation from pgfence.resource_status where resource = 'held' $$,
                  $$ select 'owner-held'::text, generation from held $$,
                  'it shows the owner and generation of the current lease');
select is((select stale from pgfence.resource_status where resource = 'held'), false, 'a current lease is not stale');
select ok((select time_left > interval '25 seconds' from pgfence.resource_status where resource = 'held'),
          'it shows the current lease''s time left');
select is((select stale from pgfence.resource_status where resource = 'stale'), true, 'an expired active lease is stale');
select is((select time_left from pgfence.resource_status where resource = 'stale'), interval '0',
          'a stale lease has no time left');
select is((select draining_leases from pgfence.resource_status where resource = 'deprecated'), 1::bigint,
          'draining_leases counts a deprecated lease');
select is((select owner from pgfence.resource_status where resource = 'deprecated'), null,
          'a resource whose lease was deprecated has no current owner');
select is((select draining_leases from pgfence.resource_status where resource = 'held'), 0::bigint,
          'a resource without a draining lease counts none');
select results_eq($$ select owner, generation from pgfence.resource_status where resource = 'released' $$,
                  $$ values (null::text, null::bigint) $$,
                  'a released resource has no owner and no generation');
select is((select owner from pgfence.resource_status where resource = 'superseded'), 'successor',
          'after a takeover the successor is the owner');
select results_eq($$ select enabled, owner from pgfence.resource_status where resource = 'idle' $$,
                  $$ values (false, null::text) $$,
                  'a disabled resource without a lease shows as disabled and unowned');
select isnt((select stale from pgfence.resource_status where resource = 'idle'), true,
            'a resource without a lease is not stale');

-- lease_status: one row per lease, each status as expected.
select results_eq($$ select resource, owner, status from pgfence.lease_status order by resource, generation $$,
                  $$ values ('deprecated'::text, 'owner-deprecated'::text, 'draining'::text),
                            ('held', 'owner-held', 'current'),
                            ('released', 'owner-released', 'released'),
                            ('stale', 'owner-stale', 'stale'),
                            ('superseded', 'predecessor', 'superseded'),
                            ('superseded', 'successor', 'current') $$,
                  'lease_status shows every lease with its status');
select is((select generation from pgfence.lease_status where resource = 'held'), (select generation from held),
          'lease_status shows the lease''s generation');
select ok((select s.generation > p.generation
             from pgfence.lease_status s, pgfence.lease_status p
            where s.resource = 'superseded' and s.owner = 'successor'
              and p.resource = 'superseded' and p.owner = 'predecessor'),
          'the successor''s generation is greater than the superseded lease''s');
select ok((select time_left > interval '0' from pgfence.lease_status where resource = 'held'),
          'a current lease has time left');
select is((select time_left from pgfence.lease_status where resource = 'stale'), interval '0',
          'a stale lease has no time left');
select is_empty($$ select status from pgfence.lease_status
                    where status in ('released', 'superseded') and ended_at is null $$,
                'every ended lease has an end time');
select is_empty($$ select status from pgfence.lease_status
                    where status in ('current', 'stale', 'draining') and ended_at is not null $$,
                'no lease that has not ended has an end time');

-- The views follow the leases as they change.
select pgfence.release(lease_id) from held;
select is((select status from pgfence.lease_status where resource = 'held'), 'released',
          'a release shows at once in lease_status');
select is((select owner from pgfence.resource_status where resource = 'held'), null,
          'and the resource shows no owner');

select * from finish();
rollback;

-- Revert pgfence:lease_status: back to its definition of release 0.1.0
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace view pgfence.lease_status as
select l.resource,
       l.generation,
       l.owner,
       case when l.state = 'active' and l.expires_at > clock_timestamp() then 'current'
            when l.state = 'active' then 'stale'
            else l.state end as status,
       l.acquired_at,
       l.renewed_at,
       l.expires_at,
       l.drained_at,
       l.ended_at,
       greatest(l.expires_at - clock_timestamp(), interval '0') as time_left,
       coalesce(h.tasks_held, 0) as tasks_held
  from pgfence.leases l
  -- Claimed tasks are few (they are in flight) and found by tasks_visibility: counted once,
  -- not looked up per lease, since tasks have no index on lease_id (claims would maintain it).
  left join (select t.lease_id, count(*) as tasks_held
               from pgfence.tasks t
              where t.state = 'claimed'
              group by t.lease_id) h on h.lease_id = l.lease_id;
comment on view pgfence.lease_status is
  'One row per lease: current, stale (active but expired: authorizes nothing), draining, released or superseded; '
  'tasks_held counts tasks its attempts still hold.';

revoke all on pgfence.lease_status from public;
grant select on pgfence.lease_status to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence:views
-- requires: protect
-- requires: request_start
-- requires: tasks
-- requires: updates
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create view pgfence.lease_status as
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

create view pgfence.resource_status as
select r.resource,
       r.enabled,
       cur.owner,
       cur.generation,
       cur.expires_at,
       case when cur.lease_id is not null then greatest(cur.expires_at - clock_timestamp(), interval '0') end as time_left,
       coalesce(cur.expires_at <= clock_timestamp(), false) as stale,
       (select count(*) from pgfence.leases d
         where d.resource = r.resource and d.state = 'draining') as draining_leases,
       (select count(*) from pgfence.invocations i
         where i.resource = r.resource and i.acknowledged_at is null
           and i.expires_at > clock_timestamp()) as pending_invocations,
       (select count(*) from pgfence.tasks t
          join pgfence.leases l on l.lease_id = t.lease_id
         where t.state = 'claimed' and l.resource = r.resource) as claimed_tasks,
       (select i.token from pgfence.update_items i
         where i.resource = r.resource and i.outcome is null) as open_update
  from pgfence.resources r
  left join pgfence.leases cur on cur.resource = r.resource and cur.state = 'active';
comment on view pgfence.resource_status is
  'One row per resource: enabled, the active lease''s owner and generation (stale when expired), draining leases, '
  'pending invocations, tasks claimed under any of its leases, the open update window it is in.';

-- Queued tasks belong to a queue, not a resource: several resources may serve one queue.
create view pgfence.queue_status as
select t.queue,
       count(*) filter (where t.state = 'queued') as queued,
       count(*) filter (where t.state = 'queued' and t.ready_at <= clock_timestamp()) as ready,
       count(*) filter (where t.state = 'claimed') as claimed,
       count(*) filter (where t.state = 'claimed' and t.visible_until < clock_timestamp()) as overdue,
       count(*) filter (where t.state = 'completed') as completed,
       count(*) filter (where t.state = 'failed') as failed,
       (select count(*) from pgfence.stale_results s
          join pgfence.tasks st on st.task_id = s.task_id
         where st.queue = t.queue) as stale_results
  from pgfence.tasks t
 group by t.queue;
comment on view pgfence.queue_status is
  'One row per queue: tasks by state (ready = claimable now, overdue = visibility ran out, not yet requeued) and stale results.';

revoke all on pgfence.lease_status, pgfence.resource_status, pgfence.queue_status from public;
grant select on pgfence.lease_status, pgfence.resource_status, pgfence.queue_status
   to pgfence_monitor, pgfence_operator;

commit;

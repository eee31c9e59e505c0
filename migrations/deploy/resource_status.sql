-- Deploy pgfence:resource_status
-- requires: lease_judgement
-- requires: leases
-- requires: invocations
-- requires: tasks
-- requires: updates
-- requires: leases_by_resource
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One grouped scan per count, joined by resource: all rows (pgfence status) cost one pass over
-- what is counted, and a query for one resource pushes its name down into each (the draining
-- leases' and pending invocations' indexes, leases_by_resource for the claimed tasks).
-- Counted per resource row, the claimed tasks alone read every lease of every resource: at
-- 100,000 resources the view took minutes.
create or replace view pgfence.resource_status as
select r.resource,
       r.enabled,
       cur.owner,
       cur.generation,
       cur.expires_at,
       case when cur.lease_id is not null then greatest(cur.expires_at - clock_timestamp(), interval '0') end as time_left,
       coalesce(not pgfence.is_current(cur.state, cur.expires_at), false) as stale,
       coalesce(d.draining_leases, 0) as draining_leases,
       coalesce(i.pending_invocations, 0) as pending_invocations,
       coalesce(c.claimed_tasks, 0) as claimed_tasks,
       u.token as open_update
  from pgfence.resources r
  left join pgfence.leases cur on cur.resource = r.resource and cur.state = 'active'
  left join (select l.resource, count(*) as draining_leases
               from pgfence.leases l
              where l.state = 'draining'
              group by l.resource) d on d.resource = r.resource
  left join (select v.resource, count(*) as pending_invocations
               from pgfence.invocations v
              where v.acknowledged_at is null and v.expires_at > clock_timestamp()
              group by v.resource) i on i.resource = r.resource
  left join (select l.resource, count(*) as claimed_tasks
               from pgfence.tasks t
               join pgfence.leases l on l.lease_id = t.lease_id
              where t.state = 'claimed'
              group by l.resource) c on c.resource = r.resource
  left join pgfence.update_items u on u.resource = r.resource and u.outcome is null;
comment on view pgfence.resource_status is
  'One row per resource: enabled, the active lease''s owner and generation (stale when expired), draining leases, '
  'pending invocations, tasks claimed under any of its leases, the open update window it is in.';

revoke all on pgfence.resource_status from public;
grant select on pgfence.resource_status to pgfence_monitor, pgfence_operator;

commit;

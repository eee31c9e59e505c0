-- Revert pgfence:resource_status: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace view pgfence.resource_status as
select r.resource,
       r.enabled,
       cur.owner,
       cur.generation,
       cur.expires_at,
       case when cur.lease_id is not null then greatest(cur.expires_at - clock_timestamp(), interval '0') end as time_left,
       coalesce(not pgfence.is_current(cur.state, cur.expires_at), false) as stale,
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

revoke all on pgfence.resource_status from public;
grant select on pgfence.resource_status to pgfence_monitor, pgfence_operator;

commit;

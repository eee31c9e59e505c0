-- Deploy pgfence:views
-- requires: protect
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;

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
       l.ended_at,
       greatest(l.expires_at - clock_timestamp(), interval '0') as time_left
  from pgfence.leases l;
comment on view pgfence.lease_status is
  'One row per lease: current, stale (active but expired: authorizes nothing), draining, released or superseded.';

create view pgfence.resource_status as
select r.resource,
       r.enabled,
       cur.owner,
       cur.generation,
       cur.expires_at,
       greatest(cur.expires_at - clock_timestamp(), interval '0') as time_left,
       coalesce(cur.expires_at <= clock_timestamp(), false) as stale,
       (select count(*) from pgfence.leases d
         where d.resource = r.resource and d.state = 'draining') as draining_leases,
       (select count(*) from pgfence.invocations i
         where i.resource = r.resource and i.acknowledged_at is null
           and i.expires_at > clock_timestamp()) as pending_invocations
  from pgfence.resources r
  left join pgfence.leases cur on cur.resource = r.resource and cur.state = 'active';
comment on view pgfence.resource_status is
  'One row per resource: enabled, the active lease''s owner and generation (stale when expired), draining leases, pending invocations.';

revoke all on pgfence.lease_status, pgfence.resource_status from public;
grant select on pgfence.lease_status, pgfence.resource_status to pgfence_monitor, pgfence_operator;

commit;

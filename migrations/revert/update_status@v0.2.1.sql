-- Revert pgfence:update_status: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.update_status(uuid);
create function pgfence.update_status(token uuid)
returns table (resource text, saved_enabled boolean, enabled boolean, active_owner text,
               draining_leases bigint, in_flight_tasks bigint, pending_invocations bigint,
               verdict text, last_heartbeat timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_not_null('token', update_status.token);
  if not exists (select from pgfence.updates u where u.token = update_status.token) then
    perform pgfence.update_not_found(update_status.token);
  end if;
  -- Reads only, so it runs in a read-only transaction. drained means observed quiet: no
  -- current lease, no draining lease still renewing, no task held, no start pending. It is
  -- not proof that a runtime terminated. unknown: a draining lease went silent (expired)
  -- while its attempts still hold tasks; nobody can tell whether their handlers stopped.
  return query
  select i.resource,
         i.saved_enabled,
         r.enabled,
         cur.owner,
         d.all_draining,
         t.held,
         p.pending,
         case when i.outcome is not null then 'finished'
              when d.silent_holding > 0 then 'unknown'
              when cur.owner is not null or d.live > 0 or t.held > 0 or p.pending > 0 then 'draining'
              else 'drained' end,
         d.heartbeat
    from pgfence.update_items i
    join pgfence.resources r on r.resource = i.resource
    left join pgfence.leases cur
           on cur.resource = i.resource and cur.state = 'active' and cur.expires_at > clock_timestamp()
    cross join lateral (
      select count(*) as all_draining,
             count(*) filter (where l.expires_at > clock_timestamp()) as live,
             count(*) filter (where l.expires_at <= clock_timestamp()
                                and exists (select from pgfence.tasks x
                                             where x.lease_id = l.lease_id and x.state = 'claimed')) as silent_holding,
             max(coalesce(l.renewed_at, l.acquired_at)) as heartbeat
        from pgfence.leases l
       where l.resource = i.resource and l.state = 'draining') d
    cross join lateral (
      select count(*) as held
        from pgfence.leases l join pgfence.tasks x on x.lease_id = l.lease_id and x.state = 'claimed'
       where l.resource = i.resource) t
    cross join lateral (
      select count(*) as pending
        from pgfence.invocations v
       where v.resource = i.resource and v.acknowledged_at is null and v.expires_at > clock_timestamp()) p
   where i.token = update_status.token
   order by i.resource;
end
$$;
comment on function pgfence.update_status(uuid) is
  'Read-only view of an update window, one row per resource, with the verdict drained (observed quiet, not proof of '
  'termination), draining, unknown (a draining lease went silent holding tasks) or finished. Raises PF005.';

revoke all on function pgfence.update_status(uuid) from public;
grant execute on function pgfence.update_status(uuid) to pgfence_operator, pgfence_monitor;

commit;

-- Revert pgfence:update_status: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Its result gained columns (in_flight, unfenced_writes): a function's result type is replaced
-- by dropping it. Nothing in the schema calls it.
do $$
begin
  if pg_catalog.to_regprocedure('pgfence.update_status(uuid)') is not null then
    drop function pgfence.update_status(uuid);
  end if;
end
$$;
create function pgfence.update_status(token uuid)
returns table (resource text, saved_enabled boolean, enabled boolean, active_owner text,
               draining_leases bigint, in_flight_tasks bigint, pending_invocations bigint,
               verdict text, last_heartbeat timestamptz, in_flight jsonb, unfenced_writes jsonb)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_resources text[];
  v_opened timestamptz;
  v_layer regproc;
  v_rows jsonb;
  v_layers jsonb := '[]'::jsonb;
begin
  perform pgfence.check_not_null('token', update_status.token);
  select u.resources, u.prepared_at into v_resources, v_opened
    from pgfence.updates u where u.token = update_status.token;
  if not found then
    perform pgfence.update_not_found(update_status.token);
  end if;
  -- Each installed layer's work in flight under the resources' leases (pgfence.layers): the
  -- core names no layer, each layer counts its own.
  for v_layer in select l.in_flight::oid::regproc from pgfence.layers l order by l.schema_name loop
    execute format('select coalesce(jsonb_agg(jsonb_build_object(''resource'', f.resource, ''kind'', f.kind, '
                   '''n'', f.in_flight)), ''[]'') from %s($1) f where f.in_flight > 0', v_layer)
       into v_rows using v_resources;
    v_layers := v_layers || v_rows;
  end loop;
  -- Reads only, so it runs in a read-only transaction. drained means observed quiet: no
  -- current lease, no draining lease still renewing, no task held, no start pending. It is
  -- not proof that a runtime terminated. Held work counts every layer's (in_flight, by kind). unknown: a draining lease went silent (expired)
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
              when cur.owner is not null or d.live > 0 or t.held > 0 or lw.n > 0 or p.pending > 0 then 'draining'
              else 'drained' end,
         d.heartbeat,
         jsonb_build_object('tasks', t.held) || lw.kinds,
         uw.writes
    from pgfence.update_items i
    join pgfence.resources r on r.resource = i.resource
    left join pgfence.leases cur
           on cur.resource = i.resource and pgfence.is_current(cur.state, cur.expires_at)
    cross join lateral (
      select count(*) as all_draining,
             count(*) filter (where pgfence.is_live(l.state, l.expires_at)) as live,
             count(*) filter (where not pgfence.is_live(l.state, l.expires_at)
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
    cross join lateral (
      select coalesce(sum(k.n), 0)::bigint as n, coalesce(jsonb_object_agg(k.kind, k.n), '{}') as kinds
        from (select e->>'kind' as kind, sum((e->>'n')::bigint) as n
                from jsonb_array_elements(v_layers) e
               where e->>'resource' = i.resource
               group by e->>'kind') k) lw
    -- Writers still unconverted (old binaries): unfenced writes of the resource's tables
    -- recorded (observe mode) since the window opened.
    cross join lateral (
      select coalesce(jsonb_agg(jsonb_build_object('table', w.table_name, 'operation', w.operation,
                                                   'role', w.role_name, 'application', w.application_name,
                                                   'writes', w.writes, 'last_at', w.last_at)
                                order by w.last_at desc), '[]') as writes
        from (select x.table_name, x.operation, x.role_name, x.application_name,
                     count(*) as writes, max(x.at) as last_at
                from pgfence.unfenced_writes x
               where x.at >= v_opened and i.resource = any (string_to_array(x.resource, ','))
               group by x.table_name, x.operation, x.role_name, x.application_name) w) uw
   where i.token = update_status.token
   order by i.resource;
end
$$;
comment on function pgfence.update_status(uuid) is
  'Read-only view of an update window, one row per resource, with the verdict drained (observed quiet: no task, '
  'message or step of any layer in flight under its leases; not proof of termination), draining, unknown (a draining '
  'lease went silent holding tasks) or finished; in_flight by kind (tasks and each layer''s), and the unfenced writes '
  'seen since the window opened. Raises PF005.';

revoke all on function pgfence.update_status(uuid) from public;
grant execute on function pgfence.update_status(uuid) to pgfence_operator, pgfence_monitor;

commit;

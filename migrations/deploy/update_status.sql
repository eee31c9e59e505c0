-- Deploy pgfence:update_status
-- requires: lease_judgement
-- requires: updates
-- requires: leases
-- requires: invocations
-- requires: tasks
-- requires: checks
-- requires: errors
-- requires: layers
-- requires: unfenced_writes
-- requires: layer_hooks
--
-- Reworked in 0.3.0: a layer's work counts per lease, judged by the core (a draining lease
-- gone silent while a layer's task or message is still in flight under it is unknown, as with
-- the core's tasks); the names a layer took into the window get its rows (window_status), and a
-- new column, workers, shows what a layer sees of each one's workers (pgflow.workers).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Its result gains a column (workers): a function's result type is replaced by dropping it.
-- Nothing in the schema calls it. (A fresh install has none yet.)
set local client_min_messages = warning;
-- (its result gains a column; a function's result type changes only so)
-- squawk-ignore ban-drop-function
drop function if exists pgfence.update_status(uuid);
create function pgfence.update_status(token uuid)
returns table (resource text, saved_enabled boolean, enabled boolean, active_owner text,
               draining_leases bigint, in_flight_tasks bigint, pending_invocations bigint,
               verdict text, last_heartbeat timestamptz, in_flight jsonb, unfenced_writes jsonb,
               workers jsonb)
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
  v_legacy jsonb := '[]'::jsonb;
begin
  perform pgfence.check_not_null('token', update_status.token);
  select u.resources, u.prepared_at into v_resources, v_opened
    from pgfence.updates u where u.token = update_status.token;
  if not found then
    perform pgfence.update_not_found(update_status.token);
  end if;
  -- A layer not yet upgraded from 0.2 counts its work per resource (in_flight (text[])): it
  -- keeps the window draining, and is judged by no lease.
  for v_layer in select l.in_flight::regprocedure::oid::regproc from pgfence.layers l
                  where (select p.pronargs from pg_proc p where p.oid = l.in_flight::regprocedure) = 1
                  order by l.schema_name loop
    execute format('select coalesce(jsonb_agg(jsonb_build_object(''resource'', f.resource, ''kind'', f.kind, '
                   '''n'', f.in_flight)), ''[]'') from %s($1) f where f.in_flight > 0', v_layer)
       into v_rows using v_resources;
    v_legacy := v_legacy || v_rows;
  end loop;
  -- Reads only, so it runs in a read-only transaction. drained means observed quiet: no
  -- current lease, no draining lease still renewing, no task, message or step of any layer in
  -- flight under the resource's leases, no start pending. It is not proof that a runtime
  -- terminated. unknown: a draining lease went silent (expired) while work started under it is
  -- still in flight; nobody can tell whether its handlers stopped.
  return query
  with work as (
    -- Everything held under a lease of these resources: the core's claimed tasks and each
    -- layer's work in flight (pgfence.layer_work), by lease.
    select l.resource, l.state, l.expires_at, w.kind, w.n
      from pgfence.leases l
      join (select t.lease_id, 'tasks'::text as kind, count(*) as n
              from pgfence.tasks t where t.state = 'claimed' group by t.lease_id) w on w.lease_id = l.lease_id
     where l.resource = any (v_resources)
    union all
    select l.resource, l.state, l.expires_at, w.kind, w.in_flight
      from pgfence.layer_work() w join pgfence.leases l on l.generation = w.generation
     where l.resource = any (v_resources)
    union all
    select e->>'resource', null, null, e->>'kind', (e->>'n')::bigint
      from jsonb_array_elements(v_legacy) e),
  -- What each layer has to say of the window (window_status): the rows of the names it took,
  -- and the workers it sees of the others.
  lw as materialized (select * from pgfence.layer_window(update_status.token, v_resources))
  select i.resource,
         i.saved_enabled,
         r.enabled,
         cur.owner,
         d.all_draining,
         h.tasks,
         p.pending,
         case when i.outcome is not null then 'finished'
              when h.silent > 0 then 'unknown'
              when cur.owner is not null or d.live > 0 or h.total > 0 or p.pending > 0 then 'draining'
              else 'drained' end,
         d.heartbeat,
         jsonb_build_object('tasks', h.tasks) || h.kinds,
         uw.writes,
         (select s.workers from lw s where s.resource = i.resource and s.verdict is null limit 1)
    from pgfence.update_items i
    join pgfence.resources r on r.resource = i.resource
    left join pgfence.leases cur
           on cur.resource = i.resource and pgfence.is_current(cur.state, cur.expires_at)
    cross join lateral (
      select count(*) as all_draining,
             count(*) filter (where pgfence.is_live(l.state, l.expires_at)) as live,
             max(coalesce(l.renewed_at, l.acquired_at)) as heartbeat
        from pgfence.leases l
       where l.resource = i.resource and l.state = 'draining') d
    cross join lateral (
      select coalesce(sum(k.n), 0)::bigint as total,
             coalesce(sum(k.n) filter (where k.kind = 'tasks'), 0)::bigint as tasks,
             coalesce(sum(k.silent), 0)::bigint as silent,
             coalesce(jsonb_object_agg(k.kind, k.n) filter (where k.kind <> 'tasks'), '{}') as kinds
        from (select x.kind, sum(x.n) as n,
                     sum(x.n) filter (where x.state = 'draining' and not pgfence.is_live(x.state, x.expires_at)) as silent
                from work x
               where x.resource = i.resource
               group by x.kind) k) h
    cross join lateral (
      select count(*) as pending
        from pgfence.invocations v
       where v.resource = i.resource and v.acknowledged_at is null and v.expires_at > clock_timestamp()) p
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
  union all
  -- The names a layer took into the window (window_prepare): the layer's rows.
  select s.resource, s.saved_enabled, s.enabled, null::text, 0::bigint, 0::bigint, s.pending, s.verdict,
         s.heartbeat, s.in_flight, '[]'::jsonb, s.workers
    from lw s
   where s.verdict is not null
   order by 1;
end
$$;
comment on function pgfence.update_status(uuid) is
  'Read-only view of an update window, one row per resource, with the verdict drained (observed quiet: no task, '
  'message or step of any layer in flight under its leases; not proof of termination), draining, unknown (a draining '
  'lease went silent holding work) or finished; in_flight by kind (tasks and each layer''s), the unfenced writes '
  'seen since the window opened, and for a name a layer took into the window its workers. Raises PF005.';

revoke all on function pgfence.update_status(uuid) from public;
grant execute on function pgfence.update_status(uuid) to pgfence_operator, pgfence_monitor;

commit;

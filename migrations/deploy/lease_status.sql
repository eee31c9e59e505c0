-- Deploy pgfence:lease_status
-- requires: lease_judgement
-- requires: leases
-- requires: tasks
-- requires: layer_hooks
--
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.
--
-- Reworked in 0.3.0: a new column, in_flight, counts what the lease holds by kind, every layer's
-- work included (a worker holding a pgflow step held "0 tasks"), as update_status does.

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
       case when pgfence.is_current(l.state, l.expires_at) then 'current'
            when l.state = 'active' then 'stale'
            else l.state end as status,
       l.acquired_at,
       l.renewed_at,
       l.expires_at,
       l.drained_at,
       l.ended_at,
       greatest(l.expires_at - clock_timestamp(), interval '0') as time_left,
       coalesce(h.tasks_held, 0) as tasks_held,
       jsonb_build_object('tasks', coalesce(h.tasks_held, 0)) || coalesce(lw.kinds, '{}') as in_flight
  from pgfence.leases l
  -- Claimed tasks are few (they are in flight) and found by tasks_visibility: counted once,
  -- not looked up per lease, since tasks have no index on lease_id (claims would maintain it).
  left join (select t.lease_id, count(*) as tasks_held
               from pgfence.tasks t
              where t.state = 'claimed'
              group by t.lease_id) h on h.lease_id = l.lease_id
  -- And each layer's work in flight under the lease, by kind (a pgmq message read, a pgflow step
  -- started, which holds its message too), as update_status counts it.
  left join (select w.generation, jsonb_object_agg(w.kind, w.n) as kinds
               from (select x.generation, x.kind, sum(x.in_flight) as n
                       from pgfence.layer_work() x group by x.generation, x.kind) w
              group by w.generation) lw on lw.generation = l.generation;
comment on view pgfence.lease_status is
  'One row per lease: current, stale (active but expired: authorizes nothing), draining, released or superseded; '
  'tasks_held counts the tasks its attempts still hold; in_flight, by kind, those and every layer''s work in flight '
  'under it.';

revoke all on pgfence.lease_status from public;
grant select on pgfence.lease_status to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence:counters
-- requires: resources
-- requires: leases
-- requires: tasks
-- requires: attempt_leases
-- requires: stale_reports
-- requires: unfenced_writes
-- requires: resource_queues
-- requires: leases_by_resource

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Counters for monitoring, one row per resource, for a postgres_exporter or Supabase metrics
-- query (docs/operations.md says what to alert on). Gauges (generation, lease_age,
-- queue_depth, oldest_ready_age) and counters over the history prune keeps (takeovers,
-- stale_results, unfenced_writes: they fall when prune removes old rows). No lease id or
-- attempt id: a lease is named by (resource, generation). Queues are not a resource's (several
-- may serve one): a resource's queues are those its leases have claimed from
-- (pgfence.resource_queues, which claim keeps).
-- It stays fast for a fleet and its history: each count is one grouped scan, joined by
-- resource, so all rows cost one pass over what is counted, and a query for one resource
-- pushes its name down into each (leases_by_resource, resource_queues' key). A queue's depth is
-- looked up once per queue (the planner memoizes it), not once per resource. What is counted
-- over history is bounded by prune's retention: takeovers (a row per takeover), stale results
-- (at most 10 per attempt), unfenced writes (a row per unfenced statement in observe mode).
create or replace view pgfence.counters as
select r.resource,
       r.enabled,
       cur.generation,
       case when cur.lease_id is null then 'none'
            when cur.expires_at > clock_timestamp() then 'current'
            else 'expired' end as lease_state,
       clock_timestamp() - cur.acquired_at as lease_age,
       coalesce(tk.takeovers, 0) as takeovers,
       coalesce(st.stale_results, 0) as stale_results,
       coalesce(uw.unfenced_writes, 0) as unfenced_writes,
       q.queues,
       coalesce(q.depth, 0) as queue_depth,
       -- The oldest queued task is the oldest ready one if it is ready at all.
       case when q.first_ready <= clock_timestamp() then clock_timestamp() - q.first_ready end as oldest_ready_age
  from pgfence.resources r
  left join pgfence.leases cur on cur.resource = r.resource and cur.state = 'active'
  left join (select l.resource, count(*) as takeovers
               from pgfence.leases l
              where l.state = 'superseded'
              group by l.resource) tk on tk.resource = r.resource
  left join (select l.resource, count(*) as stale_results
               from pgfence.stale_results s
               join pgfence.tasks t on t.task_id = s.task_id
               join pgfence.leases l on l.lease_id = t.attempt_leases[s.attempt]
              group by l.resource) st on st.resource = r.resource
  left join (select w.resource, count(*) as unfenced_writes
               from pgfence.unfenced_writes x
              cross join unnest(pg_catalog.string_to_array(x.resource, ',')) w(resource)
              group by w.resource) uw on uw.resource = r.resource
  left join (select rq.resource,
                    array_agg(rq.queue) as queues,
                    sum(d.depth)::bigint as depth,
                    min(d.first_ready) as first_ready
               -- In queue order (the key's): an aggregate ordered by itself would sort each
               -- resource's queues apart, a third of the cost at 100,000 resources.
               from (select x.resource, x.queue from pgfence.resource_queues x
                      order by x.resource, x.queue) rq
              -- No clock in here, so that the planner may memoize it per queue.
              cross join lateral (select count(*) as depth, min(x.ready_at) as first_ready
                                    from pgfence.tasks x
                                   where x.queue = rq.queue and x.state = 'queued') d
              group by rq.resource) q on q.resource = r.resource;
comment on view pgfence.counters is
  'Per resource: generation, lease state and age, takeovers, stale results, unfenced writes (over the history kept), '
  'the queues its leases claimed from, their queued tasks and the age of the oldest ready one. No capability.';

revoke all on pgfence.counters from public;
grant select on pgfence.counters to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence:counters
-- requires: resources
-- requires: leases
-- requires: tasks
-- requires: attempt_leases
-- requires: stale_reports
-- requires: unfenced_writes

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
-- may serve one): a resource's queues are those its leases have claimed from.
create view pgfence.counters as
select r.resource,
       r.enabled,
       cur.generation,
       case when cur.lease_id is null then 'none'
            when cur.expires_at > clock_timestamp() then 'current'
            else 'expired' end as lease_state,
       clock_timestamp() - cur.acquired_at as lease_age,
       (select count(*) from pgfence.leases l
         where l.resource = r.resource and l.state = 'superseded') as takeovers,
       (select count(*) from pgfence.stale_results s
          join pgfence.tasks t on t.task_id = s.task_id
          join pgfence.leases l on l.lease_id = t.attempt_leases[s.attempt]
         where l.resource = r.resource) as stale_results,
       (select count(*) from pgfence.unfenced_writes w
         where r.resource = any (pg_catalog.string_to_array(w.resource, ','))) as unfenced_writes,
       q.queues,
       coalesce(q.depth, 0) as queue_depth,
       q.oldest_ready_age
  from pgfence.resources r
  left join pgfence.leases cur on cur.resource = r.resource and cur.state = 'active'
  left join lateral (
         select array_agg(w.queue order by w.queue) as queues,
                sum(w.depth)::bigint as depth,
                max(w.oldest) as oldest_ready_age
           from (select t.queue,
                        (select count(*) from pgfence.tasks x
                          where x.queue = t.queue and x.state = 'queued') as depth,
                        (select clock_timestamp() - min(x.ready_at) from pgfence.tasks x
                          where x.queue = t.queue and x.state = 'queued'
                            and x.ready_at <= clock_timestamp()) as oldest
                   from (select distinct t.queue
                           from pgfence.tasks t
                           join pgfence.leases l on l.lease_id = t.lease_id
                          where l.resource = r.resource) t) w) q on true;
comment on view pgfence.counters is
  'Per resource: generation, lease state and age, takeovers, stale results, unfenced writes (over the history kept), '
  'the queues its leases claimed from, their queued tasks and the age of the oldest ready one. No capability.';

revoke all on pgfence.counters from public;
grant select on pgfence.counters to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence:queue_status
-- requires: tasks
-- requires: stale_results
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

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

revoke all on pgfence.queue_status from public;
grant select on pgfence.queue_status to pgfence_monitor, pgfence_operator;

commit;

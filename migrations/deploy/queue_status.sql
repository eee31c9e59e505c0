-- Deploy pgfence:queue_status
-- requires: tasks
-- requires: stale_results
-- requires: queue_tallies
-- Monitoring views. They show no lease_id: a lease_id is the owner's capability.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Queued tasks belong to a queue, not a resource: several resources may serve one queue.
-- Live tasks (queued, claimed) are counted from the two partial indexes that hold them;
-- finished ones are not counted at all: each statement that finishes tasks adds their number
-- to pgfence.queue_tallies, so completed and failed cost a sum of a few rows per queue
-- however long the history, and count every task finished since the install (prune does not
-- lower them). Stale results are counted over the history prune keeps.
create or replace view pgfence.queue_status as
select q.queue,
       coalesce(w.queued, 0) as queued,
       coalesce(w.ready, 0) as ready,
       coalesce(c.claimed, 0) as claimed,
       coalesce(c.overdue, 0) as overdue,
       coalesce(y.completed, 0)::bigint as completed,
       coalesce(y.failed, 0)::bigint as failed,
       coalesce(s.stale_results, 0) as stale_results
  from (select t.queue from pgfence.tasks t where t.state = 'queued'
        union
        select t.queue from pgfence.tasks t where t.state = 'claimed'
        union
        select y.queue from pgfence.queue_tallies y) q
  left join (select t.queue, count(*) as queued,
                    count(*) filter (where t.ready_at <= clock_timestamp()) as ready
               from pgfence.tasks t
              where t.state = 'queued'
              group by t.queue) w on w.queue = q.queue
  left join (select t.queue, count(*) as claimed,
                    count(*) filter (where t.visible_until < clock_timestamp()) as overdue
               from pgfence.tasks t
              where t.state = 'claimed'
              group by t.queue) c on c.queue = q.queue
  left join (select y.queue, sum(y.completed) as completed, sum(y.failed) as failed
               from pgfence.queue_tallies y
              group by y.queue) y on y.queue = q.queue
  left join (select st.queue, count(*) as stale_results
               from pgfence.stale_results x
               join pgfence.tasks st on st.task_id = x.task_id
              group by st.queue) s on s.queue = q.queue;
comment on view pgfence.queue_status is
  'One row per queue: tasks by state (ready = claimable now, overdue = visibility ran out, not yet requeued; completed and '
  'failed since the install) and stale results.';

revoke all on pgfence.queue_status from public;
grant select on pgfence.queue_status to pgfence_monitor, pgfence_operator;

commit;

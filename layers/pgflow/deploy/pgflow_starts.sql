-- Deploy pgfence_pgflow:pgflow_starts
-- requires: pgflow_attempts
--
-- 0.3.0: the monitors' view of the starts asks the core about leases (pgfence.lease_facts)
-- instead of reading pgfence.leases; the same columns.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace view pgfence_pgflow.starts as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.pgmq_attempt_id) as read_ref,
       pgfence.capability_ref(a.lease_id) as lease_ref, l.resource, a.flow_slug, a.run_id, a.step_slug,
       a.task_index, a.msg_id, a.attempts_count, a.started_at, a.outcome, a.finished_at
  from pgfence_pgflow.attempts a
  left join pgfence.lease_facts(array(select distinct x.lease_id from pgfence_pgflow.attempts x)) l
         on l.lease_id = a.lease_id;

commit;

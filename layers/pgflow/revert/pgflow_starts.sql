-- Revert pgfence_pgflow:pgflow_starts

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace view pgfence_pgflow.starts as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.pgmq_attempt_id) as read_ref,
       pgfence.capability_ref(a.lease_id) as lease_ref, l.resource, a.flow_slug, a.run_id, a.step_slug,
       a.task_index, a.msg_id, a.attempts_count, a.started_at, a.outcome, a.finished_at
  from pgfence_pgflow.attempts a
  left join pgfence.leases l on l.lease_id = a.lease_id;

commit;

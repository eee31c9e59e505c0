-- Verify pgfence_pgflow:pgflow_attempts
select attempt_id, pgmq_attempt_id, flow_slug, run_id, step_slug, task_index, msg_id, attempts_count, lease_id,
       started_at, outcome, finished_at
  from pgfence_pgflow.attempts where false;
select attempt_id, report, kind, body, received_at from pgfence_pgflow.stale_results where false;
select attempt_ref, lease_ref from pgfence_pgflow.starts where false;
select attempt_ref, report from pgfence_pgflow.stale where false;

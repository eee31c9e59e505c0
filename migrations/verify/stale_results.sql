-- Verify pgfence:stale_results
select attempt_id, task_id, attempt, kind, body, received_at from pgfence.stale_results where false;

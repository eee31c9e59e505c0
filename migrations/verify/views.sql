-- Verify pgfence:views
select resource, generation, owner, status, acquired_at, renewed_at, expires_at, drained_at, ended_at, time_left, tasks_held
  from pgfence.lease_status where false;
select resource, enabled, owner, generation, expires_at, time_left, stale, draining_leases, pending_invocations, claimed_tasks, open_update
  from pgfence.resource_status where false;
select queue, queued, ready, claimed, overdue, completed, failed, stale_results from pgfence.queue_status where false;

-- Verify pgfence:resource_status
select resource, enabled, owner, generation, expires_at, time_left, stale, draining_leases, pending_invocations, claimed_tasks, open_update
  from pgfence.resource_status where false;

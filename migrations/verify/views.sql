-- Verify pgfence:views
select resource, generation, owner, status, acquired_at, renewed_at, expires_at, ended_at, time_left
  from pgfence.lease_status where false;
select resource, enabled, owner, generation, expires_at, time_left, stale, draining_leases, pending_invocations
  from pgfence.resource_status where false;

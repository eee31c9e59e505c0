-- Verify pgfence:lease_status
select resource, generation, owner, status, acquired_at, renewed_at, expires_at, drained_at, ended_at, time_left, tasks_held
  from pgfence.lease_status where false;

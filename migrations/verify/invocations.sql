-- Verify pgfence:invocations
select invocation_id, resource, requested_at, expires_at, acknowledged_at, lease_id from pgfence.invocations where false;
select 'pgfence.invocations_pending'::regclass;

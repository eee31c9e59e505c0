-- Verify pgfence:invocations
select invocation_id, resource, requested_at, expires_at, acknowledged_at, lease_id from pgfence.invocations where false;
-- (Its index invocations_pending is replaced by prune's invocations_pending_expiry: a verify
-- runs against the newest schema too, at adoption with --log-only, so it checks the table only.)

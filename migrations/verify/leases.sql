-- Verify pgfence:leases
select lease_id, resource, generation, owner, state, acquired_at, renewed_at, expires_at, renewed_from, drained_at, ended_at, invocation_id
  from pgfence.leases where false;
select invocation_id, resource, requested_at, expires_at, acknowledged_at, lease_id from pgfence.invocations where false;
select 'pgfence.acquire(text, text, interval, uuid)'::regprocedure, 'pgfence.renew(uuid, interval)'::regprocedure,
       'pgfence.drain(uuid)'::regprocedure, 'pgfence.release(uuid)'::regprocedure,
       'pgfence.deprecate(text)'::regprocedure;

-- Verify pgfence:leases
select last_value, is_called from pgfence.generation where false;
select (l).lease_id, (l).resource, (l).generation, (l).expires_at from (select null::pgfence.lease) t (l) where false;
select lease_id, resource, generation, owner, state, acquired_at, renewed_at, expires_at, renewed_from, drained_at, ended_at, invocation_id
  from pgfence.leases where false;
select 'pgfence.leases_one_active'::regclass, 'pgfence.leases_draining'::regclass;

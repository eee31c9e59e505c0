-- Verify pgfence:leases_by_resource
select 'pgfence.leases_by_resource'::regclass;

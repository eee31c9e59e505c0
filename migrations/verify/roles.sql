-- Verify pgfence:roles
select 1 / (count(*) = 3)::int
  from pg_catalog.pg_roles
 where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor');

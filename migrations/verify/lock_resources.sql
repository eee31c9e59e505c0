-- Verify pgfence:lock_resources
select 'pgfence.lock_resources(text[])'::regprocedure;

-- Verify pgfence:check_batch
select 'pgfence.check_batch(uuid[])'::regprocedure;

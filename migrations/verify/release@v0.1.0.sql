-- Verify pgfence:release
select 'pgfence.release(uuid)'::regprocedure;

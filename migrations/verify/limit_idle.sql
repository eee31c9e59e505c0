-- Verify pgfence:limit_idle
select 'pgfence.limit_idle()'::regprocedure;

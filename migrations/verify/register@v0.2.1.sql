-- Verify pgfence:register
select 'pgfence.register(text, boolean)'::regprocedure;

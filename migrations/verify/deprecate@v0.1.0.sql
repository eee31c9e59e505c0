-- Verify pgfence:deprecate
select 'pgfence.deprecate(text)'::regprocedure;

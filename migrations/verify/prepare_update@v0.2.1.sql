-- Verify pgfence:prepare_update
select 'pgfence.prepare_update(text[], uuid)'::regprocedure;

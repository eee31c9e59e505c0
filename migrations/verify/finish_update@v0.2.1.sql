-- Verify pgfence:finish_update
select 'pgfence.finish_update(uuid)'::regprocedure;

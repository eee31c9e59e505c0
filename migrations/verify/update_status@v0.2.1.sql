-- Verify pgfence:update_status
select 'pgfence.update_status(uuid)'::regprocedure;

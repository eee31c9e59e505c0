-- Verify pgfence:fence
select 'pgfence.fence(uuid)'::regprocedure;

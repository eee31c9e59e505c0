-- Verify pgfence:extend
select 'pgfence.extend(uuid, interval)'::regprocedure;

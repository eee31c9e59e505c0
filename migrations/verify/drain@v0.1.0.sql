-- Verify pgfence:drain
select 'pgfence.drain(uuid)'::regprocedure;

-- Verify pgfence:request_start
select 'pgfence.request_start(text, interval)'::regprocedure;

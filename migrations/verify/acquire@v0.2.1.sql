-- Verify pgfence:acquire
select 'pgfence.acquire(text, text, interval, uuid)'::regprocedure;

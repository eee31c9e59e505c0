-- Verify pgfence:claim
select 'pgfence.claim(uuid, text, int, interval)'::regprocedure;

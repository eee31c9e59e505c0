-- Verify pgfence:hmac
select 'pgfence.hmac(text, bytea)'::regprocedure;

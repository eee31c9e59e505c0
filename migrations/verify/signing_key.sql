-- Verify pgfence:signing_key
select 1 / count(*)::int from pgfence.signing_key;
select 'pgfence.sign(text, bytea)'::regprocedure;

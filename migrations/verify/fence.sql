-- Verify pgfence:fence
select 'pgfence.fence(uuid)'::regprocedure;
select 'pgfence.fence_token(text, bytea)'::regprocedure;
select 1 / count(*)::int from pgfence.signing_key;
select 'pgfence.sign(text, bytea)'::regprocedure;

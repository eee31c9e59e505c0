-- Verify pgfence:fence
select 'pgfence.fence(uuid)'::regprocedure;
select 'pgfence.fence_token(text, bytea)'::regprocedure;

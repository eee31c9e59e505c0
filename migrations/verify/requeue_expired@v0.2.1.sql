-- Verify pgfence:requeue_expired
select 'pgfence.requeue_expired(int)'::regprocedure;

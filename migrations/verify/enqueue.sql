-- Verify pgfence:enqueue
select 'pgfence.enqueue(text, jsonb, int)'::regprocedure;

-- Verify pgfence_pgmq:finish
select 'pgfence_pgmq.finish(uuid[], text)'::regprocedure;

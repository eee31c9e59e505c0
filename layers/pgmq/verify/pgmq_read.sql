-- Verify pgfence_pgmq:pgmq_read
select 'pgfence.pgmq_read(uuid, text, interval, int)'::regprocedure;

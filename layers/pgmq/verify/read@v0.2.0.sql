-- Verify pgfence_pgmq:read
select 'pgfence_pgmq.read(uuid, text, interval, int)'::regprocedure;

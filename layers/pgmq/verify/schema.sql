-- Verify pgfence_pgmq:schema
select 'pgfence_pgmq'::regnamespace;

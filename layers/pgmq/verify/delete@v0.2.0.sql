-- Verify pgfence_pgmq:delete
select 'pgfence_pgmq.delete(uuid)'::regprocedure, 'pgfence_pgmq.delete_many(uuid[])'::regprocedure;

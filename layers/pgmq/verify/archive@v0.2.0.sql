-- Verify pgfence_pgmq:archive
select 'pgfence_pgmq.archive(uuid)'::regprocedure, 'pgfence_pgmq.archive_many(uuid[])'::regprocedure;

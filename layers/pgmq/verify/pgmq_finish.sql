-- Verify pgfence_pgmq:pgmq_finish
select 'pgfence.pgmq_archive(uuid)'::regprocedure, 'pgfence.pgmq_delete(uuid)'::regprocedure,
       'pgfence.pgmq_archive_many(uuid[])'::regprocedure, 'pgfence.pgmq_delete_many(uuid[])'::regprocedure,
       'pgfence.pgmq_set_vt(uuid, interval)'::regprocedure;

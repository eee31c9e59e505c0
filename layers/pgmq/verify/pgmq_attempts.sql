-- Verify pgfence_pgmq:pgmq_attempts
select attempt_id, queue, msg_id, read_ct, lease_id, read_at, outcome, finished_at from pgfence.pgmq_attempts where false;
select 'pgfence.pgmq_attempt_uuid(bigint, int)'::regprocedure, 'pgfence.pgmq_queue_table(text)'::regprocedure;

-- Verify pgfence_pgmq:attempts
select attempt_id, queue, msg_id, read_ct, enqueued_at, lease_id, outcome from pgfence_pgmq.attempts where false;
select attempt_id, report, kind from pgfence_pgmq.stale_results where false;
select attempt_ref, lease_ref from pgfence_pgmq.reads where false;
select 'pgfence_pgmq.queue_table(text)'::regprocedure, 'pgfence_pgmq.check_allowed(text, text, boolean)'::regprocedure;

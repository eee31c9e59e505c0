-- A fresh round of archives: :tasks messages read once, in queue bench under the lease of
-- bench-pgmq with their pgfence_pgmq.attempts rows (as pgfence_pgmq.read leaves them), and in queue
-- bench_raw; and the handle each client presents: the attempt id, or the msg_id.
-- psql -v tasks=N -f bench/fill_pgmq_read.sql
\ir fill_pgmq.sql
update pgmq.q_bench set read_ct = 1, last_read_at = clock_timestamp(), vt = clock_timestamp() + interval '1 day';
update pgmq.q_bench_raw set read_ct = 1, last_read_at = clock_timestamp(), vt = clock_timestamp() + interval '1 day';
insert into pgfence_pgmq.attempts (attempt_id, queue, msg_id, read_ct, enqueued_at, lease_id)
select pgfence_pgmq.attempt_uuid(m.msg_id, 1), 'bench', m.msg_id, 1, m.enqueued_at, md5('bench-pgmq')::uuid
  from pgmq.q_bench m;
truncate bench.handles, bench.handles_raw;
insert into bench.handles (n, attempt_id) select a.msg_id, a.attempt_id from pgfence_pgmq.attempts a;
insert into bench.handles_raw (n, task_id) select m.msg_id, m.msg_id from pgmq.q_bench_raw m;
select setval('bench.handles_seq', 1, false) as restarted \gset
select setval('bench.handles_raw_seq', 1, false) as restarted \gset
vacuum analyze pgmq.q_bench, pgmq.q_bench_raw, pgfence_pgmq.attempts, bench.handles, bench.handles_raw;

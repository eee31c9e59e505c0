-- Baseline of pgmq_archive.sql: pgmq's own archive by msg_id, the id looked up the same way.
select pgmq.archive('bench_raw', h.task_id)
  from bench.handles_raw h
 where h.n = (select nextval('bench.handles_raw_seq'));

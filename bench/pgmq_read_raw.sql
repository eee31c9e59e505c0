-- Baseline of pgmq_read.sql: pgmq's own read of 10, on a queue of the same size.
select * from pgmq.read('bench_raw', 3600, 10);

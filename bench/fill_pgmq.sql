-- A fresh pgmq queue for a read round: :tasks visible messages in queue bench (for
-- pgfence_pgmq.read) and the same in queue bench_raw (for pgmq.read), vacuumed.
-- psql -v tasks=N -f bench/fill_pgmq.sql
truncate pgmq.q_bench, pgmq.a_bench, pgmq.q_bench_raw, pgmq.a_bench_raw restart identity;
truncate pgfence_pgmq.stale_results, pgfence_pgmq.attempts;
select count(*) from pgmq.send_batch('bench', array(select jsonb_build_object('job', 'resize', 'n', g)
                                                     from generate_series(1, :tasks) g)) \gset
select count(*) from pgmq.send_batch('bench_raw', array(select jsonb_build_object('job', 'resize', 'n', g)
                                                         from generate_series(1, :tasks) g)) \gset
vacuum analyze pgmq.q_bench, pgmq.q_bench_raw, pgfence_pgmq.attempts;

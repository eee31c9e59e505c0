-- A fresh round of pgflow runs: :tasks runs of flow :flow (bench_flow for pgfence_pgflow,
-- bench_flow_raw for pgflow's own protocol), each a queued task with its message, vacuumed.
-- psql -v tasks=N -v flow=F -f bench/fill_pgflow.sql (fill_pgflow_fenced.sql, fill_pgflow_raw.sql)
truncate pgflow.step_tasks, pgflow.step_states, pgflow.runs, pgfence_pgflow.stale_results,
         pgfence_pgflow.attempts, pgfence_pgmq.stale_results, pgfence_pgmq.attempts, realtime.stand_in_calls;
truncate pgmq.q_bench_flow, pgmq.a_bench_flow, pgmq.q_bench_flow_raw, pgmq.a_bench_flow_raw restart identity;
select count(*) from (select pgflow.start_flow(:'flow', '{}') from generate_series(1, :tasks)) s \gset
vacuum analyze pgflow.step_tasks, pgflow.step_states, pgflow.runs, pgmq.q_bench_flow, pgmq.q_bench_flow_raw;

-- fill_pgflow.sql for the baseline (flow bench_flow_raw).
\set flow bench_flow_raw
\ir fill_pgflow.sql

-- fill_pgflow.sql for the fenced member (flow bench_flow).
\set flow bench_flow
\ir fill_pgflow.sql

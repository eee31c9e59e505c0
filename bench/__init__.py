"""pgfence's benchmarks: the pgbench scripts (bench/*.sql) and their driver (bench/driver,
run by scripts/bench). See docs/performance.md."""

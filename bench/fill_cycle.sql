-- A fresh start for a cycle round: both queues empty (each transaction of the cycle enqueues
-- the jobs it claims). psql -f bench/fill_cycle.sql
truncate pgfence.tasks, bench.queue restart identity;
vacuum analyze pgfence.tasks, bench.queue;

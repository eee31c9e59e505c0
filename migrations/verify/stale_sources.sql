-- Verify pgfence:stale_sources
select pgmq_queue from pgfence.stale_results where false;

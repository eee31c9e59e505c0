-- Verify pgfence:queue_status
select queue, queued, ready, claimed, overdue, completed, failed, stale_results from pgfence.queue_status where false;

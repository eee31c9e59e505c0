-- Verify pgfence:stale_reports
select attempt_id, report from pgfence.stale_results where false;

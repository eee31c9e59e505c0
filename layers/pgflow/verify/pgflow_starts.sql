-- Verify pgfence_pgflow:pgflow_starts
select attempt_ref, read_ref, lease_ref, resource from pgfence_pgflow.starts where false;

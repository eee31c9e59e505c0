-- Verify pgfence:attempt_leases
select attempt_leases from pgfence.tasks where false;

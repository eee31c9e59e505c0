-- Verify pgfence:protections
select tbl, resources, mode, protected_at from pgfence.protections where false;

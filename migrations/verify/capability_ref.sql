-- Verify pgfence:capability_ref
select 1/(pgfence.capability_ref(null) is null)::int;

-- Verify pgfence:ref
select 1/(pgfence.ref('00000000-0000-4000-8000-000000000000') ~ '^[0-9a-f]{12}$')::int;

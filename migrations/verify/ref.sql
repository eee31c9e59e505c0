-- Verify pgfence:ref
select 1/(pgfence.ref('00000000-0000-4000-8000-000000000000')
          = left(pgfence.capability_ref('00000000-0000-4000-8000-000000000000'), 12))::int;

-- Verify pgfence_pgflow:pgflow_schema
select 'pgfence_pgflow'::regnamespace;

-- Verify pgfence_pgflow:release_0.3.1
select 1 / (pgfence.installed_release('pgfence_pgflow') = '0.3.1')::int;
select 1 / (not exists (select from pgfence.schema_drift('pgfence_pgflow')))::int;

-- Verify pgfence_pgmq:release_0.3.0
select 1 / (pgfence.installed_release('pgfence_pgmq') = '0.3.0')::int;
select 1 / (not exists (select from pgfence.schema_drift('pgfence_pgmq')))::int;

-- Verify pgfence:release_0.3.1
select 1 / (pgfence.version() = '0.3.1')::int;
select 1 / (not exists (select from pgfence.schema_drift('pgfence')))::int;

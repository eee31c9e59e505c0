-- Verify pgfence:version
select 1 / (pgfence.version() = '0.1.0')::int;

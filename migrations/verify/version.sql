-- Verify pgfence:version
select 1 / (pgfence.version() = '0.2.0')::int;

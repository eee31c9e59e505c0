-- Verify pgfence:schema
select pg_catalog.has_schema_privilege('pgfence', 'usage');

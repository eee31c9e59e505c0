-- Verify pgfence:schema
select pg_catalog.has_schema_privilege('pgfence', 'usage');
select 'pgfence.check_name(text, text)'::regprocedure;
select 'pgfence.check_interval(text, interval)'::regprocedure;

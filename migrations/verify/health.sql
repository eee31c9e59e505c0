-- Verify pgfence:health
select 'pgfence.health()'::regprocedure, 'pgfence.health_checks()'::regprocedure;
select 1 / (to_regprocedure('pgfence.schema_objects()') is null)::int;

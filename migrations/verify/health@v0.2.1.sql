-- Verify pgfence:health
select 'pgfence.health()'::regprocedure, 'pgfence.schema_objects()'::regprocedure;
select 1 / (count(*) > 0)::int from pgfence.manifest;

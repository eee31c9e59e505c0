-- Verify pgfence:health@v0.2.1
-- health() and a digest of the schema exist (0.2.1's pgfence.schema_objects(), or from 0.3.0 on,
-- under `sqitch deploy --log-only` of a newer database, pgfence.schema_objects(name)).
select 'pgfence.health()'::regprocedure;
select 1 / (to_regprocedure('pgfence.schema_objects()') is not null
            or to_regprocedure('pgfence.schema_objects(name)') is not null)::int;

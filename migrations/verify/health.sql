-- Verify pgfence:health
select 'pgfence.health()'::regprocedure, 'pgfence.health_checks()'::regprocedure,
       'pgfence.cron_job_problem(regprocedure)'::regprocedure;
select 1 / (to_regprocedure('pgfence.schema_objects()') is null)::int;

-- Verify pgfence:health
select 'pgfence.health()'::regprocedure, 'pgfence.schema_objects()'::regprocedure,
       'pgfence.lockdown_problems(name)'::regprocedure, 'pgfence.cron_job_problem(regprocedure)'::regprocedure;

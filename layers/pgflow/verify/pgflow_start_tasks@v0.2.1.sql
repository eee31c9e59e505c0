-- Verify pgfence_pgflow:pgflow_start_tasks
select 'pgfence_pgflow.start_tasks(uuid, text, text, interval, int)'::regprocedure,
       'pgfence_pgflow.worker_id(uuid, bytea)'::regprocedure;

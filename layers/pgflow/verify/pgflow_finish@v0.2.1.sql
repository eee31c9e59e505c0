-- Verify pgfence_pgflow:pgflow_finish
select 'pgfence_pgflow.complete_task(uuid, jsonb)'::regprocedure, 'pgfence_pgflow.fail_task(uuid, text)'::regprocedure,
       'pgfence_pgflow.finish(uuid, text, jsonb, text)'::regprocedure;

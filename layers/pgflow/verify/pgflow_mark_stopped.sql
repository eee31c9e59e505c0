-- Verify pgfence_pgflow:pgflow_mark_stopped
select 'pgfence_pgflow.mark_worker_stopped(uuid)'::regprocedure;

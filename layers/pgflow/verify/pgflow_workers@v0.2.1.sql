-- Verify pgfence_pgflow:pgflow_workers
select 'pgfence_pgflow.ensure_workers()'::regprocedure, 'pgfence_pgflow.sync_workers()'::regprocedure,
       'pgfence_pgflow.requeue_stalled_tasks()'::regprocedure, 'pgfence_pgflow.prune_workers(interval)'::regprocedure;

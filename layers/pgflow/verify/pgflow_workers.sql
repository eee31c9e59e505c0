-- Verify pgfence_pgflow:pgflow_workers
select 'pgfence_pgflow.ensure_workers()'::regprocedure, 'pgfence_pgflow.sync_workers()'::regprocedure,
       'pgfence_pgflow.requeue_stalled_tasks()'::regprocedure, 'pgfence_pgflow.prune_workers(interval)'::regprocedure;
select 1 / count(*)::int from pgfence.layers
 where schema_name = 'pgfence_pgflow' and enabled_changed::regprocedure = 'pgfence_pgflow.enabled_changed(text[])'::regprocedure;

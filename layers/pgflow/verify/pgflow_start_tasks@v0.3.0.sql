-- Verify pgfence_pgflow:pgflow_start_tasks
select 'pgfence_pgflow.start_tasks(uuid, text, text, interval, int)'::regprocedure,
       'pgfence_pgflow.stalled(timestamptz, int, boolean, boolean)'::regprocedure,
       'pgfence_pgflow.start_lease_live(uuid, text, int, int)'::regprocedure;

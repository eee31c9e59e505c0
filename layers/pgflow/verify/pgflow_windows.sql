-- Verify pgfence_pgflow:pgflow_windows
select token, function_name, saved_enabled, changed, outcome from pgfence_pgflow.windows where false;
select 1 / count(*)::int from pgfence.layers where schema_name = 'pgfence_pgflow'
   and window_prepare::regprocedure = 'pgfence_pgflow.window_prepare(uuid, text[])'::regprocedure
   and window_status::regprocedure = 'pgfence_pgflow.window_status(uuid, text[])'::regprocedure
   and window_finish::regprocedure = 'pgfence_pgflow.window_finish(uuid)'::regprocedure;

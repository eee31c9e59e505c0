-- Verify pgfence_pgflow:pgflow_complete_many
select 'pgfence_pgflow.complete_many(uuid[], jsonb[])'::regprocedure,
       'pgfence_pgflow.fail_many(uuid[], text[])'::regprocedure,
       'pgfence_pgflow.finish_many(uuid[], text, jsonb[], text[])'::regprocedure;

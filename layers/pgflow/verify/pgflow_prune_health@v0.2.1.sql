-- Verify pgfence_pgflow:pgflow_prune_health
select 1 / count(*)::int from pgfence.layers
 where schema_name = 'pgfence_pgflow' and prune::regprocedure = 'pgfence_pgflow.prune(interval)'::regprocedure
   and health::regprocedure = 'pgfence_pgflow.health()'::regprocedure;

-- Verify pgfence_pgmq:prune_health
select 1 / count(*)::int from pgfence.layers
 where schema_name = 'pgfence_pgmq' and prune::regprocedure = 'pgfence_pgmq.prune(interval)'::regprocedure
   and health::regprocedure = 'pgfence_pgmq.health()'::regprocedure;

-- Verify pgfence:capability_ref
select 'pgfence.capability_ref(uuid)'::regprocedure, 'pgfence.invoker()'::regprocedure;

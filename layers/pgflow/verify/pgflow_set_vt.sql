-- Verify pgfence_pgflow:pgflow_set_vt
select 'pgfence_pgflow.set_vt(uuid, interval)'::regprocedure;

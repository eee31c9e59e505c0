-- Verify pgfence_pgmq:set_vt
select 'pgfence_pgmq.set_vt(uuid, interval)'::regprocedure;

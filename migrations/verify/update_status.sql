-- Verify pgfence:update_status
select 1 / count(*)::int from pg_catalog.pg_proc p
 where p.oid = 'pgfence.update_status(uuid)'::regprocedure and 'workers' = any (p.proargnames);

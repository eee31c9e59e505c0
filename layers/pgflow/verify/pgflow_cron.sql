-- Verify pgfence_pgflow:pgflow_cron
select jobname, jobid, command from pgfence_pgflow.cron_jobs where false;
select 'pgfence_pgflow.setup_cron()'::regprocedure, 'pgfence_pgflow.undo_cron()'::regprocedure;
select 1 / count(*)::int from pg_catalog.pg_proc p
 where p.oid = 'pgfence_pgflow.setup_cron()'::regprocedure and p.proretset;

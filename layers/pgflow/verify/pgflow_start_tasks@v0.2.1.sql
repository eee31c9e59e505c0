-- Verify pgfence_pgflow:pgflow_start_tasks (release 0.2.1's instance; also run by `sqitch deploy
-- --log-only` over a later release, where pgfence.owner_ref replaced worker_id)
select 'pgfence_pgflow.start_tasks(uuid, text, text, interval, int)'::regprocedure;

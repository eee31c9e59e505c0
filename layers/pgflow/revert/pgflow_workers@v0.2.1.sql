-- Revert pgfence_pgflow:pgflow_workers

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgflow.setup_cron();
drop function pgfence_pgflow.prune_workers(interval);
drop function pgfence_pgflow.requeue_stalled_tasks();
drop function pgfence_pgflow.as_maintenance(text, interval);
drop function pgfence_pgflow.ensure_workers();
drop function pgfence_pgflow.sync_workers();
drop trigger pgfence_pgflow_worker_functions on pgfence.resources;
do $$
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is not null then
    execute 'drop trigger if exists pgfence_follow_resource on pgflow.worker_functions';
  end if;
end
$$;
drop function pgfence_pgflow.follow_resource();

commit;

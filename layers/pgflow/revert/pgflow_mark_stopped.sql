-- Revert pgfence_pgflow:pgflow_mark_stopped

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgflow.mark_worker_stopped(uuid);

commit;

-- Revert pgfence_pgflow:pgflow_set_vt

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgflow.set_vt(uuid, interval);

commit;

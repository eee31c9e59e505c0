-- Revert pgfence:capability_ref

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.invoker();
drop function pgfence.capability_ref(uuid);

commit;

-- Revert pgfence:unregister

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.unregister(text);

commit;

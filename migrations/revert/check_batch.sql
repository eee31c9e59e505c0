-- Revert pgfence:check_batch

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.check_batch(uuid[]);

commit;

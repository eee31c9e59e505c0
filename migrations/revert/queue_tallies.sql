-- Revert pgfence:queue_tallies

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.fold_tallies();
drop table pgfence.queue_tallies;

commit;

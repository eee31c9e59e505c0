-- Revert pgfence:resource_queues

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop table pgfence.resource_queues;

commit;

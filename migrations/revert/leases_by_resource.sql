-- Revert pgfence:leases_by_resource

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- squawk-ignore require-concurrent-index-deletion
drop index pgfence.leases_by_resource;

commit;

-- Deploy pgfence:leases_by_resource
-- requires: leases

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A resource's leases, for the monitors: counters' takeovers, resource_status' claimed tasks,
-- lease_status of one resource. Without it each of those read every lease of every resource
-- (a sequential scan per resource row: seconds at 10,000 resources). acquire adds one entry a
-- lease; ending a lease already changes an indexed state; a renewal changes neither key, so
-- it stays a HOT update.
-- Built inside the upgrade's transaction (CONCURRENTLY cannot be), so acquires wait for the
-- build: at 100,000 leases, about a second (docs/upgrading.md).
-- squawk-ignore require-concurrent-index-creation
create index leases_by_resource on pgfence.leases (resource, state);

commit;

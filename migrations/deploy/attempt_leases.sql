-- Deploy pgfence:attempt_leases
-- requires: tasks

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- attempt_leases[n]: the lease attempt n of the task was claimed under, so that a result from
-- an older attempt can be checked against its own signature, like the current attempt's. NULL
-- for attempts claimed before release 0.2.0: their stale results are recorded unverified.
alter table pgfence.tasks add column attempt_leases uuid[];

commit;

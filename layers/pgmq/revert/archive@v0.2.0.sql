-- Revert pgfence_pgmq:archive

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgmq.archive_many(uuid[]);
drop function pgfence_pgmq.archive(uuid);

commit;

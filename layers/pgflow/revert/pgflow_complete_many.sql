-- Revert pgfence_pgflow:pgflow_complete_many

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgflow.complete_many(uuid[], jsonb[]);
drop function pgfence_pgflow.fail_many(uuid[], text[]);
drop function pgfence_pgflow.finish_many(uuid[], text, jsonb[], text[]);

commit;

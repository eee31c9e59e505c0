-- Revert pgfence_pgmq:attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence_pgmq.mark(text, uuid);
drop function pgfence_pgmq.check_allowed(text, text, boolean);
drop function pgfence_pgmq.queue_table(text);
drop function pgfence_pgmq.attempt_uuid(bigint, int);
drop view pgfence_pgmq.reads;
drop table pgfence_pgmq.stale_results;
drop table pgfence_pgmq.attempts;

commit;

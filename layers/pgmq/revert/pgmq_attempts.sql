-- Revert pgfence_pgmq:pgmq_attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.pgmq_queue_table(text);
drop function pgfence.pgmq_attempt_uuid(bigint, int);
drop table pgfence.pgmq_attempts;
delete from pgfence.stale_results where pgmq_queue is not null;

commit;

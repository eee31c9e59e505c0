-- Revert pgfence:stale_sources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

delete from pgfence.stale_results where pgmq_queue is not null;
alter table pgfence.stale_results drop constraint stale_results_source_check;
alter table pgfence.stale_results drop constraint stale_results_kind_check;
alter table pgfence.stale_results add constraint stale_results_kind_check check (kind in ('complete', 'fail'));
alter table pgfence.stale_results drop column pgmq_queue;

commit;

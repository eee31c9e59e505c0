-- Deploy pgfence:stale_sources
-- requires: stale_reports

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Stale results of pgmq messages (the optional pgmq layer) are kept here too, where operators
-- already look: task_id is then the message's msg_id, attempt its read count, and pgmq_queue
-- names the queue. NULL pgmq_queue: a task of pgfence's own queue.
alter table pgfence.stale_results add column pgmq_queue text;
-- Widened, not weakened: the check is replaced by one that admits the two kinds of results
-- of a pgmq message as well. stale_results holds only refused results, a small table: its
-- checks are validated under the lock at once.
-- squawk-ignore ban-drop-constraint
alter table pgfence.stale_results drop constraint stale_results_kind_check;
-- squawk-ignore constraint-missing-not-valid
alter table pgfence.stale_results add constraint stale_results_kind_check
  check (kind in ('complete', 'fail', 'archive', 'delete'));
-- squawk-ignore constraint-missing-not-valid
alter table pgfence.stale_results add constraint stale_results_source_check
  check ((pgmq_queue is null) = (kind in ('complete', 'fail')));
comment on column pgfence.stale_results.pgmq_queue is
  'The pgmq queue of a message (task_id is its msg_id, attempt its read count); NULL for a task of pgfence''s queue.';

commit;

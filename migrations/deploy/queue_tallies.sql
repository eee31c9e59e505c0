-- Deploy pgfence:queue_tallies
-- requires: tasks

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Finished tasks per queue, kept incrementally: each statement that finishes tasks (complete,
-- complete_many, report, requeue_expired) adds one row of its counts here, in its own
-- transaction, so a count is exact and commits or rolls back with the work it counts.
-- Writers only insert (no row is updated in place), so completions never wait for each other
-- on a counter; fold_tallies sums a queue's rows into one. pgfence.queue_status adds up what
-- is here instead of counting a history of millions of finished tasks (a scan of each).
-- No primary key: nothing looks a row up, and an index would cost every completion an entry.
create table pgfence.queue_tallies (
  queue     text not null,
  completed bigint not null default 0,
  failed    bigint not null default 0
);
comment on table pgfence.queue_tallies is
  'Finished tasks per queue, one row per finishing statement until folded. Not a public interface: read pgfence.queue_status.';

-- The counts of the history kept so far, as one row per queue. (Under Sqitch, tasks finished
-- while the later changes of this upgrade deploy, before complete and the other writers are
-- reworked, are not counted: docs/upgrading.md. The one-file upgrade is one transaction.)
insert into pgfence.queue_tallies (queue, completed, failed)
select t.queue, count(*) filter (where t.state = 'completed'), count(*) filter (where t.state = 'failed')
  from pgfence.tasks t
 where t.state in ('completed', 'failed')
 group by t.queue;

revoke all on table pgfence.queue_tallies from public;

-- Sums each queue's rows into one, at most 10,000 rows a call. The rows are taken FOR UPDATE
-- SKIP LOCKED and deleted by the statement that inserts their sum, so a row is folded once
-- however many folds run at once, and a fold never waits. requeue_expired calls it (workers
-- call that when their queue is empty, and pg_cron every minute): between folds the tallies
-- grow by a row per finishing statement.
create function pgfence.fold_tallies()
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if not exists (select from pgfence.queue_tallies q group by q.queue having count(*) > 1) then
    return;   -- folded already: no rows rewritten
  end if;
  with gone as (
    delete from pgfence.queue_tallies q
     where q.ctid = any (array(select x.ctid from pgfence.queue_tallies x limit 10000 for update skip locked))
    returning q.queue, q.completed, q.failed)
  insert into pgfence.queue_tallies (queue, completed, failed)
  select g.queue, sum(g.completed), sum(g.failed) from gone g group by g.queue;
end
$$;
comment on function pgfence.fold_tallies() is
  'Sums the rows of pgfence.queue_tallies into one per queue (at most 10,000 rows a call; rows another fold holds are skipped).';

revoke all on function pgfence.fold_tallies() from public;

commit;

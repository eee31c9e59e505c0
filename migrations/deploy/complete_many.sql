-- Deploy pgfence:complete_many
-- requires: complete
-- requires: report
-- requires: checks
-- requires: check_batch
-- requires: errors
-- requires: queue_tallies
-- requires: releases

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.expect_release('pgfence', '0.3.0'); end $$;

-- complete for many attempts at once, by complete's rule for each (I5): one call, one lock
-- statement and one UPDATE for the common case, whatever the batch's size.
create or replace function pgfence.complete_many(attempt_ids uuid[], results jsonb[] default null)
returns table (attempt_id uuid, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- One generic plan for its statements: a custom plan, which plpgsql keeps choosing because the
-- batch's size is known only per call (a custom plan of one id costs far less than the generic
-- one, costed for a size unknown), is made again on every call, and planning the UPDATE (attempt_holds
-- and the signature inlined) cost several times its execution. The generic plan is the plan
-- for every size: each id's task found by primary key.
set plan_cache_mode = 'force_generic_plan'
as $$
declare
  v_n int := cardinality(complete_many.attempt_ids);
  v_accepted bigint[];
  v_key bytea;
begin
  perform pgfence.check_batch(complete_many.attempt_ids);
  if complete_many.results is not null
     and (cardinality(complete_many.results) <> v_n or array_ndims(complete_many.results) <> 1) then
    perform pgfence.invalid_argument('results', 'must be NULL or a one-dimensional array of one result per attempt id',
                                     format('%s results for %s ids', cardinality(complete_many.results), v_n));
  end if;
  -- The rows are locked first, in task_id order, before anything is written. The UPDATE below
  -- meets its rows in the order the caller gave the ids (a loop over them), so two batches over
  -- overlapping tasks in different orders would each lock a row the other then waits for: a
  -- deadlock (40P01) for one of them. Locked in one global order, the later batch waits for
  -- the earlier to end and then judges its rows on what that one committed. Everything else
  -- that locks task rows to write them (report, extend, requeue_expired's and claim's SKIP
  -- LOCKED) locks one row at a time or never waits, so it cannot close a cycle with a batch.
  -- FOR UPDATE, as report takes it: its calls below find the lock theirs already. One id
  -- cannot close a cycle: its row is locked by the UPDATE (or report), as complete locks it.
  if v_n > 1 then
    perform from pgfence.tasks t
      where t.task_id = any (array(select pgfence.attempt_task(u.a) from unnest(complete_many.attempt_ids) u(a)))
      order by t.task_id
      for update;
  end if;
  -- The key read once, as claim reads it: joined into the UPDATE, the one-row table (its
  -- statistics never gathered) would be costed as hundreds of rows, and the tasks scanned whole.
  select k.hmac_key into v_key from pgfence.signing_key k;
  -- The common case in one statement: every attempt that holds its task completes it, by the
  -- one condition complete uses (pgfence.attempt_holds, inlined), counted in its queue's tally
  -- (pgfence.queue_tallies: a row per queue of the batch).
  with done as (
    update pgfence.tasks t
       set state = 'completed', result = u.result, reported = true,
           visible_until = null, finished_at = clock_timestamp()
      from unnest(complete_many.attempt_ids, complete_many.results) with ordinality as u(attempt_id, result, n)
     where t.task_id = pgfence.attempt_task(u.attempt_id)
       and pgfence.attempt_holds(t.task_id, t.attempt, t.lease_id, t.reported, v_key, u.attempt_id)
    returning u.n, t.queue),
  tally as (
    insert into pgfence.queue_tallies (queue, completed)
    select d.queue, count(*) from done d group by d.queue)
  select array_agg(d.n) into v_accepted from done d;
  -- Everything else (a retry, a stale or unknown attempt, a bad id), one by one in the order
  -- given, by the rule of report: an unknown id raises 22023 and so undoes the whole batch.
  return query
  select u.attempt_id,
         case when d.n is not null then 'accepted' else pgfence.report(u.attempt_id, 'complete', u.result) end
    from unnest(complete_many.attempt_ids, complete_many.results) with ordinality as u(attempt_id, result, n)
    left join unnest(v_accepted) d(n) on d.n = u.n
   order by u.n;
end
$$;
comment on function pgfence.complete_many(uuid[], jsonb[]) is
  'complete for each attempt of attempt_ids (with results[i], or NULL), by its rule: one row per id, in the order given, '
  'outcome accepted, duplicate or stale. Raises 22023, changing nothing, for a NULL or empty array, more than 1000 ids, '
  'a NULL or repeated id, results of another length, or any unknown attempt.';

revoke all on function pgfence.complete_many(uuid[], jsonb[]) from public;
grant execute on function pgfence.complete_many(uuid[], jsonb[]) to pgfence_worker;

commit;

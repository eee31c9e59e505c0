-- Revert pgfence:complete: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The one accept condition of complete and complete_many (I5): attempt_id is the attempt that
-- holds the task row (task_id, attempt, lease_id, reported are the row's) and it has not
-- reported yet, its signature matching the row's attempt and lease under key. An expression
-- its callers inline into their UPDATE (LANGUAGE sql, no SET, every name qualified, each
-- parameter used once; see pgfence.sign): no function call per row.
create or replace function pgfence.attempt_holds(task_id bigint, attempt int, lease_id uuid, reported boolean,
                                                 key bytea, attempt_id uuid)
returns boolean
language sql
stable
as $$
  select not attempt_holds.reported
     and pgfence.attempt_uuid(attempt_holds.task_id, attempt_holds.attempt, attempt_holds.lease_id,
                              attempt_holds.key) operator(pg_catalog.=) attempt_holds.attempt_id;
$$;
revoke all on function pgfence.attempt_holds(bigint, int, uuid, boolean, bytea, uuid) from public;

create or replace function pgfence.complete(attempt_id uuid, result jsonb default null)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  -- The common case in one statement: the attempt that holds the task completes it, once (the
  -- id is the current attempt's only if its signature matches the row's attempt and lease).
  -- No clock in the condition, so a lock wait cannot make it wrong: a concurrent update of the
  -- row is re-checked (EvalPlanQual), and a transaction that only locked it changed nothing.
  update pgfence.tasks t
     set state = 'completed', result = complete.result, reported = true,
         visible_until = null, finished_at = clock_timestamp()
    from pgfence.signing_key k
   where t.task_id = pgfence.attempt_task(complete.attempt_id)
     and pgfence.attempt_holds(t.task_id, t.attempt, t.lease_id, t.reported, k.hmac_key, complete.attempt_id);
  if found then
    perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
    return 'accepted';
  end if;
  -- Everything else (a retry, a stale or unknown attempt, a bad id) by the rule of report.
  return pgfence.report(complete.attempt_id, 'complete', complete.result);
end
$$;
comment on function pgfence.complete(uuid, jsonb) is
  'Finishes a task with result: accepted from the attempt that holds it (also after its lease expired), '
  'duplicate for a retry of a reported attempt, stale (recorded in pgfence.stale_results) from a superseded attempt. Raises 22023 for an unknown attempt.';

revoke all on function pgfence.complete(uuid, jsonb) from public;
grant execute on function pgfence.complete(uuid, jsonb) to pgfence_worker;

commit;

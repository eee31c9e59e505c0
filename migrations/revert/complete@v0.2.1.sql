-- Revert pgfence:complete: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Refused while it would strand live state: a task claimed under 0.2.0 (the lease of its
-- attempt is in attempt_leases; one claimed under 0.1.0 has none there, and keeps working)
-- holds an attempt id signed with HMAC-SHA256, which release 0.1.0 cannot verify (its
-- complete, fail or extend would raise 22023). The share lock keeps claims out until this step commits; Sqitch
-- runs every step in a transaction of its own, so each step that would strand them checks.
lock table pgfence.tasks in share mode;
do $refuse$
declare
  v_claimed bigint;
  v_queues text;
begin
  select pg_catalog.count(*), pg_catalog.string_agg(distinct t.queue, ', ')
    into v_claimed, v_queues
    from pgfence.tasks t
   where t.state operator(pg_catalog.=) 'claimed'
     and t.attempt_leases[t.attempt] is not null;
  if v_claimed operator(pg_catalog.>) 0 then
    raise exception 'pgfence: revert of complete refused: % task(s) claimed under 0.2.0 (queues %) '
                    'would no longer be completed, failed or extended under release 0.1.0',
                    v_claimed, v_queues
      using errcode = '55000',
            hint = 'let them finish, or pause their resources (pgfence.prepare_update) until '
                   'update_status says drained, then revert again; sqitch deploy restores '
                   'what was reverted before this step';
  end if;
end
$refuse$;

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
   where t.task_id = pgfence.attempt_task(complete.attempt_id) and not t.reported
     and pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id, k.key) = complete.attempt_id;
  if found then
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

drop function pgfence.attempt_holds(bigint, int, uuid, boolean, bytea, uuid);

commit;

-- Revert pgfence:report: back to its definition of release 0.1.0

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
    raise exception 'pgfence: revert of report refused: % task(s) claimed under 0.2.0 (queues %) '
                    'would no longer be completed, failed or extended under release 0.1.0',
                    v_claimed, v_queues
      using errcode = '55000',
            hint = 'let them finish, or pause their resources (pgfence.prepare_update) until '
                   'update_status says drained, then revert again; sqitch deploy restores '
                   'what was reverted before this step';
  end if;
end
$refuse$;

-- complete and fail share one rule (I5): the result of the attempt that holds the task is
-- accepted, even after its lease expired or drained, as long as no newer attempt claimed it.
create or replace function pgfence.report(attempt_id uuid, kind text, body jsonb)
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_task_id bigint;
  v_attempt int;
  v_task pgfence.tasks;
  v_final boolean;
begin
  select a.task_id, a.attempt into v_task_id, v_attempt from pgfence.attempt_of(report.attempt_id) a;
  select * into v_task from pgfence.tasks t where t.task_id = v_task_id for update;
  if not found or v_attempt > v_task.attempt
     or (v_attempt = v_task.attempt
         and pgfence.attempt_uuid(v_task_id, v_attempt, v_task.lease_id) <> report.attempt_id) then
    perform pgfence.unknown_attempt(report.attempt_id);
  end if;
  -- An older attempt's lease is not kept, so its signature cannot be checked: it can change
  -- nothing but a row in stale_results.
  if v_attempt < v_task.attempt then
    insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body)
    values (report.attempt_id, v_task_id, v_attempt, report.kind, report.body)
    on conflict on constraint stale_results_pkey do nothing;
    return 'stale';
  end if;
  if v_task.reported then
    return 'duplicate';
  end if;
  if report.kind = 'complete' then
    update pgfence.tasks t
       set state = 'completed', result = report.body, reported = true,
           visible_until = null, finished_at = clock_timestamp()
     where t.task_id = v_task_id;
  else
    v_final := v_task.attempt >= v_task.max_attempts;
    -- Retries back off exponentially, 2 s, 4 s, 8 s ... at most an hour.
    update pgfence.tasks t
       set state = case when v_final then 'failed' else 'queued' end,
           error = report.body, reported = true, visible_until = null,
           ready_at = clock_timestamp() + least(interval '1 second' * power(2, least(v_task.attempt, 12)), interval '1 hour'),
           finished_at = case when v_final then clock_timestamp() end
     where t.task_id = v_task_id;
  end if;
  return 'accepted';
end
$$;

revoke all on function pgfence.report(uuid, text, jsonb) from public;

commit;

-- Deploy pgfence:report
-- requires: limit_idle
-- requires: attempt_leases
-- requires: stale_reports
-- requires: tasks
-- requires: stale_results
-- requires: attempt_id
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

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
  v_lease_id uuid;
  v_reports bigint;
begin
  select a.task_id, a.attempt into v_task_id, v_attempt from pgfence.attempt_of(report.attempt_id) a;
  select * into v_task from pgfence.tasks t where t.task_id = v_task_id for update;
  if not found or v_attempt > v_task.attempt
     or (v_attempt = v_task.attempt
         and not pgfence.attempt_signed(report.attempt_id, v_task_id, v_attempt, v_task.lease_id)) then
    perform pgfence.unknown_attempt(report.attempt_id);
  end if;
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
  if v_attempt < v_task.attempt then
    -- An older attempt is checked against the lease it was claimed under, like the current
    -- one, so nobody can make up stale results for a task. Attempts claimed before release
    -- 0.2.0 have no lease on record: theirs are recorded unverified (they change nothing but
    -- stale_results, and the bound below holds for them too).
    v_lease_id := v_task.attempt_leases[v_attempt];
    if v_lease_id is not null
       and not pgfence.attempt_signed(report.attempt_id, v_task_id, v_attempt, v_lease_id) then
      perform pgfence.unknown_attempt(report.attempt_id);
    end if;
    -- Each different report is kept (I5); a retry of one already kept adds nothing.
    if not exists (select from pgfence.stale_results s
                    where s.attempt_id = report.attempt_id and s.kind = report.kind
                      and s.body is not distinct from report.body) then
      select count(*) into v_reports from pgfence.stale_results s
       where s.task_id = v_task_id and s.attempt = v_attempt;
      if v_reports >= 10 then
        raise exception 'pgfence: attempt % of task % has sent 10 stale results already', v_attempt, v_task_id
          using errcode = '54000',
                hint = 'the attempt is superseded: stop reporting; its results are in pgfence.stale_results';
      end if;
      insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body, report)
      values (report.attempt_id, v_task_id, v_attempt, report.kind, report.body,
              (select coalesce(max(s.report), 0) + 1 from pgfence.stale_results s
                where s.attempt_id = report.attempt_id));
    end if;
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

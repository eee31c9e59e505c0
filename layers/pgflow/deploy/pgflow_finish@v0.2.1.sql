-- Deploy pgfence_pgflow:pgflow_finish
-- requires: pgflow_attempts
--
-- Reworked in 0.2.1 (0.2.0's script is deploy/pgflow_finish@v0.2.0.sql): the same rules in
-- fewer statements (docs/performance.md).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- complete_task and fail_task share one rule (I5), the one of pgfence's own complete and fail:
-- the result of the attempt that holds the task is accepted, even after its lease expired or
-- drained, as long as nobody started the task again since (it is still started, with the
-- attempts_count this attempt's start gave it); pgflow's own complete_task or fail_task then
-- applies it. Otherwise it is stale, recorded in pgfence_pgflow.stale_results, and pgflow
-- never sees it.
create or replace function pgfence_pgflow.finish(attempt_id uuid, kind text, output jsonb, error_message text)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence_pgflow.attempts;
  v_holds boolean;
  v_superseded boolean;
  v_body jsonb;
  v_reports bigint;
  v_was text;
  v_status text;
  v_queue_table text;
begin
  if finish.attempt_id is null then
    perform pgfence.check_not_null('attempt_id', finish.attempt_id);
  end if;
  if finish.kind is null or finish.kind not in ('complete', 'fail') then
    perform pgfence.invalid_argument('kind', 'must be complete or fail', finish.kind);
  end if;
  -- Locked, so that two calls of one attempt are decided one after the other.
  select * into v_attempt from pgfence_pgflow.attempts a where a.attempt_id = finish.attempt_id for update;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence_pgflow.start_tasks',
                                     finish.attempt_id::text);
  end if;
  perform pgfence_pgflow.check_allowed(case when finish.kind = 'complete'
                                            then 'pgflow.complete_task(uuid, text, int, jsonb)'::regprocedure
                                            else 'pgflow.fail_task(uuid, text, int, text)' end);
  -- pgflow's own complete_task and fail_task, run by the caller, would archive the message or
  -- set its visibility: what pgmq needs for that too.
  v_queue_table := pgfence_pgmq.queue_table(v_attempt.flow_slug);
  perform pgfence_pgmq.check_allowed(v_queue_table, 'delete', true);
  -- The run first: pgflow's complete_task and fail_task lock it after this function has locked
  -- the task, and a fail_task that fails the run then updates the run's other tasks and
  -- archives their messages, which another result of the run holds: two results of one run
  -- would deadlock. Taken first, the run orders them.
  perform from pgflow.runs r where r.run_id = v_attempt.run_id for update;
  -- Then the message, then the task: the order in which start_tasks takes them (the read,
  -- then the takeover). A start that read the message and has not committed is waited for,
  -- and the task judged on what it committed; a start that comes later skips the message
  -- (SKIP LOCKED). In the other order, a takeover and a late result would deadlock: each
  -- would hold the row the other's next statement needs.
  execute format('select from pgmq.%I m where m.msg_id = $1 for update', v_queue_table)
    using v_attempt.msg_id;
  select st.status = 'started' and st.attempts_count = v_attempt.attempts_count,
         st.attempts_count > v_attempt.attempts_count
    into v_holds, v_superseded
    from pgflow.step_tasks st
   where st.run_id = v_attempt.run_id and st.step_slug = v_attempt.step_slug
     and st.task_index = v_attempt.task_index
     for update;
  -- The core's order of verdicts: an attempt that a newer start superseded is stale, also
  -- when its own result had been accepted before (a fail that pgflow retried) or the task has
  -- finished since; a retry of the attempt that still holds the task, or finished it, is a
  -- duplicate.
  if v_attempt.outcome is not null and not coalesce(v_superseded, false) then
    return 'duplicate';
  end if;
  if not coalesce(v_holds, false) then
    v_body := case when finish.kind = 'complete' then finish.output
                   else pg_catalog.jsonb_build_object('error_message', finish.error_message) end;
    -- Each different report kept, a retry of one adds nothing, at most 10 per attempt.
    if not exists (select from pgfence_pgflow.stale_results s
                    where s.attempt_id = finish.attempt_id and s.kind = finish.kind
                      and s.body is not distinct from v_body) then
      select count(*) into v_reports from pgfence_pgflow.stale_results s where s.attempt_id = finish.attempt_id;
      if v_reports >= 10 then
        raise exception 'pgfence: a superseded attempt of pgflow task %/%/% has sent 10 stale results already',
                        v_attempt.run_id, v_attempt.step_slug, v_attempt.task_index
          using errcode = '54000',
                hint = 'the attempt is superseded: stop reporting; its results are in pgfence_pgflow.stale_results';
      end if;
      insert into pgfence_pgflow.stale_results (attempt_id, report, kind, body)
      values (finish.attempt_id, v_reports + 1, finish.kind, v_body);
    end if;
    return 'stale';
  end if;
  -- This result is authorized by its attempt, whose lease may have expired since: pgflow's
  -- writes (step_tasks, the queue table, both perhaps protected) are shown the lease's
  -- resource for this call alone, and the transaction's markers are put back after it.
  select pgfence.mark_fenced(l.resource, k.hmac_key) into v_was
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id = v_attempt.lease_id;
  if finish.kind = 'complete' then
    select t.status into v_status
      from pgflow.complete_task(v_attempt.run_id, v_attempt.step_slug, v_attempt.task_index, finish.output) t;
  else
    select t.status into v_status
      from pgflow.fail_task(v_attempt.run_id, v_attempt.step_slug, v_attempt.task_index, finish.error_message) t;
  end if;
  -- (An assignment, evaluated as an expression: a PERFORM would be a statement of its own.)
  v_was := set_config('pgfence.fenced', v_was, true);
  update pgfence_pgflow.attempts a
     set outcome = finish.kind, finished_at = clock_timestamp()
   where a.attempt_id = finish.attempt_id;
  -- The pgmq layer's record of the read: pgflow archives the message of a task that completed
  -- or failed for good (a task queued for a retry keeps it, to be read again).
  if v_status in ('completed', 'failed') then
    update pgfence_pgmq.attempts p
       set outcome = 'archive', finished_at = clock_timestamp()
     where p.attempt_id = v_attempt.pgmq_attempt_id and p.outcome is null;
  end if;
  return 'accepted';
end
$$;
comment on function pgfence_pgflow.finish(uuid, text, jsonb, text) is
  'complete_task (kind complete) and fail_task (kind fail). Raises 22023.';

-- The two names of the contract: inlined into the caller's query (LANGUAGE sql, no SET, not
-- SECURITY DEFINER, every name qualified), so a call costs one function's SET, not two.
create or replace function pgfence_pgflow.complete_task(attempt_id uuid, output jsonb)
returns text
language sql
as $$
  select pgfence_pgflow.finish(complete_task.attempt_id, 'complete', complete_task.output, null);
$$;
comment on function pgfence_pgflow.complete_task(uuid, jsonb) is
  'Completes the task of an attempt with pgflow''s complete_task: accepted while nobody started the task again '
  'since, also after the lease expired; duplicate for a retry of an accepted attempt; stale (recorded in '
  'pgfence_pgflow.stale_results, never applied) otherwise, also after the task finished. Raises 42501 (the caller''s role '
  'may not do this with pgflow itself), 22023 for an unknown attempt.';

create or replace function pgfence_pgflow.fail_task(attempt_id uuid, error_message text)
returns text
language sql
as $$
  select pgfence_pgflow.finish(fail_task.attempt_id, 'fail', null, fail_task.error_message);
$$;
comment on function pgfence_pgflow.fail_task(uuid, text) is
  'Fails the task of an attempt with pgflow''s fail_task (which retries it or fails it for good), by the rule of '
  'complete_task.';

revoke all on function pgfence_pgflow.finish(uuid, text, jsonb, text), pgfence_pgflow.complete_task(uuid, jsonb),
                       pgfence_pgflow.fail_task(uuid, text)
  from public;
grant execute on function pgfence_pgflow.finish(uuid, text, jsonb, text), pgfence_pgflow.complete_task(uuid, jsonb),
                         pgfence_pgflow.fail_task(uuid, text)
   to pgfence_worker;

commit;

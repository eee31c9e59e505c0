-- Deploy pgfence_pgflow:pgflow_set_vt
-- requires: pgflow_attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A started task's message stays hidden for its step's timeout + 2 s (start_tasks). A worker
-- that reaches a later task of its batch with less than that left, or whose handler needs
-- longer, keeps the message for its attempt, as pgfence_pgmq.set_vt does for a read: by the
-- attempt alone, only while it holds the task. pgflow still has the task started with the
-- attempts_count this start left (no takeover, retry or requeue since), and the message has
-- not been read again since this start's read (pgfence_pgmq.set_vt's own check, made in the
-- same update that moves the visibility: a takeover's read that commits first wins).
create function pgfence_pgflow.set_vt(attempt_id uuid, vt interval)
returns timestamptz
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence_pgflow.attempts;
begin
  perform pgfence.check_not_null('attempt_id', set_vt.attempt_id);
  perform pgfence.check_interval('vt', set_vt.vt);
  select * into v_attempt from pgfence_pgflow.attempts a where a.attempt_id = set_vt.attempt_id;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence_pgflow.start_tasks',
                                     set_vt.attempt_id::text);
  end if;
  if v_attempt.outcome is not null
     or not exists (select from pgflow.step_tasks st
                     where st.run_id = v_attempt.run_id and st.step_slug = v_attempt.step_slug
                       and st.task_index = v_attempt.task_index and st.status = 'started'
                       and st.attempts_count = v_attempt.attempts_count) then
    return null;
  end if;
  return pgfence_pgmq.set_vt(v_attempt.pgmq_attempt_id, set_vt.vt);
end
$$;
comment on function pgfence_pgflow.set_vt(uuid, interval) is
  'A long pgflow handler (or a later task of a batch) keeps its task''s message: visible again vt from now. NULL when the '
  'attempt no longer holds the task (finished, taken over, retried, requeued) or the message was read again since. '
  'Raises 42501 (the caller''s role may not update the flow''s queue with pgmq itself), 22023 for an unknown attempt.';

revoke all on function pgfence_pgflow.set_vt(uuid, interval) from public;
grant execute on function pgfence_pgflow.set_vt(uuid, interval) to pgfence_worker;

commit;

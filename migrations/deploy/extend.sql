-- Deploy pgfence:extend
-- requires: limit_idle
-- requires: attempt_id
-- requires: tasks
-- requires: attempt_id
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.extend(attempt_id uuid, visibility interval)
returns timestamptz
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_task_id bigint;
  v_attempt int;
  v_task pgfence.tasks;
  v_until timestamptz;
begin
  perform pgfence.check_interval('visibility', extend.visibility);
  select a.task_id, a.attempt into v_task_id, v_attempt from pgfence.attempt_of(extend.attempt_id) a;
  select * into v_task from pgfence.tasks t where t.task_id = v_task_id for update;
  if not found or v_attempt > v_task.attempt
     or (v_attempt = v_task.attempt
         and not pgfence.attempt_signed(extend.attempt_id, v_task_id, v_attempt, v_task.lease_id)) then
    perform pgfence.unknown_attempt(extend.attempt_id);
  end if;
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
  if v_attempt < v_task.attempt or v_task.state <> 'claimed' or v_task.reported then
    return null;
  end if;
  update pgfence.tasks t
     set visible_until = clock_timestamp() + extend.visibility
   where t.task_id = v_task_id
  returning t.visible_until into v_until;
  return v_until;
end
$$;
comment on function pgfence.extend(uuid, interval) is
  'A long handler keeps its task: visibility from now. NULL when the attempt no longer holds the task. Raises 22023 for an unknown attempt.';

revoke all on function pgfence.extend(uuid, interval) from public;
grant execute on function pgfence.extend(uuid, interval) to pgfence_worker;

commit;

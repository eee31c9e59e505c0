-- Revert pgfence:extend: back to its definition of release 0.1.0

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
    raise exception 'pgfence: revert of extend refused: % task(s) claimed under 0.2.0 (queues %) '
                    'would no longer be completed, failed or extended under release 0.1.0',
                    v_claimed, v_queues
      using errcode = '55000',
            hint = 'let them finish, or pause their resources (pgfence.prepare_update) until '
                   'update_status says drained, then revert again; sqitch deploy restores '
                   'what was reverted before this step';
  end if;
end
$refuse$;

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
         and pgfence.attempt_uuid(v_task_id, v_attempt, v_task.lease_id) <> extend.attempt_id) then
    perform pgfence.unknown_attempt(extend.attempt_id);
  end if;
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

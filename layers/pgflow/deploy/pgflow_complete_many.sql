-- Deploy pgfence_pgflow:pgflow_complete_many
-- requires: pgflow_finish
--
-- 0.3.1: a batch's results in one call (issue 45), as the core's complete_many and the pgmq
-- layer's archive_many take them: one row per attempt, each judged by finish, the one rule of
-- complete_task and fail_task.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- finish for many attempts at once (kind complete with outputs[i], or fail with
-- error_messages[i]): each attempt's verdict is finish's, called for it in the order given, so
-- the rule is written once. What the batch adds is the order of its locks: finish locks an
-- attempt, then its run, its message and its task; a batch that let finish take them attempt
-- by attempt would hold the first attempt's rows while it waits for the second's, and two
-- batches over the same runs in different orders would deadlock (40P01 for one). So every row
-- finish will lock is locked first, each kind in one global order across the batch (attempts
-- by attempt_id, runs by run_id, messages by queue and msg_id, tasks by their key), the kinds
-- in finish's order: a later batch waits for the earlier and then judges its attempts on what
-- that one committed (duplicate, or stale). finish then finds its locks held. Waits and idle
-- time are bounded as finish bounds them (limit_lock_wait, then finish's limit_idle).
create function pgfence_pgflow.finish_many(attempt_ids uuid[], kind text, outputs jsonb[], error_messages text[])
returns table (attempt_id uuid, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_n int := cardinality(finish_many.attempt_ids);
  v_lock_wait text;
  v_flow text;
begin
  perform pgfence.check_batch(finish_many.attempt_ids);
  if finish_many.kind is null or finish_many.kind not in ('complete', 'fail') then
    perform pgfence.invalid_argument('kind', 'must be complete or fail', finish_many.kind);
  end if;
  if finish_many.outputs is not null
     and (cardinality(finish_many.outputs) <> v_n or array_ndims(finish_many.outputs) <> 1) then
    perform pgfence.invalid_argument('outputs', 'must be NULL or a one-dimensional array of one output per attempt id',
                                     format('%s outputs for %s ids', cardinality(finish_many.outputs), v_n));
  end if;
  if finish_many.error_messages is not null
     and (cardinality(finish_many.error_messages) <> v_n or array_ndims(finish_many.error_messages) <> 1) then
    perform pgfence.invalid_argument('error_messages',
                                     'must be NULL or a one-dimensional array of one message per attempt id',
                                     format('%s messages for %s ids', cardinality(finish_many.error_messages), v_n));
  end if;
  -- finish's checks of the caller's rights, made before anything is locked (finish makes them
  -- again per attempt, at no cost then).
  perform pgfence_pgflow.check_allowed(case when finish_many.kind = 'complete'
                                            then 'pgflow.complete_task(uuid, text, int, jsonb)'::regprocedure
                                            else 'pgflow.fail_task(uuid, text, int, text)' end);
  for v_flow in select distinct a.flow_slug from pgfence_pgflow.attempts a
                 where a.attempt_id = any (finish_many.attempt_ids) order by a.flow_slug loop
    perform pgfence_pgmq.check_allowed(pgfence_pgmq.queue_table(v_flow), 'delete', true);
  end loop;
  v_lock_wait := pgfence.limit_lock_wait();
  -- The attempts (an unknown id is left to finish: 22023, undoing the batch).
  perform from pgfence_pgflow.attempts a
   where a.attempt_id = any (finish_many.attempt_ids)
   order by a.attempt_id
     for update of a;
  -- Their runs.
  perform from pgfence_pgflow.attempts a
    join pgflow.runs r on r.run_id = a.run_id
   where a.attempt_id = any (finish_many.attempt_ids)
   order by r.run_id
     for update of r;
  -- Their messages, a queue at a time in the flows' order.
  for v_flow in select distinct a.flow_slug from pgfence_pgflow.attempts a
                 where a.attempt_id = any (finish_many.attempt_ids) order by a.flow_slug loop
    execute format('select from pgmq.%I m where m.msg_id = any ($1) order by m.msg_id for update',
                   pgfence_pgmq.queue_table(v_flow))
      using array(select a.msg_id from pgfence_pgflow.attempts a
                   where a.attempt_id = any (finish_many.attempt_ids) and a.flow_slug = v_flow);
  end loop;
  -- Their tasks.
  perform from pgfence_pgflow.attempts a
    join pgflow.step_tasks st
      on st.run_id = a.run_id and st.step_slug = a.step_slug and st.task_index = a.task_index
   where a.attempt_id = any (finish_many.attempt_ids)
   order by st.run_id, st.step_slug, st.task_index
     for update of st;
  -- The caller's setting back, for finish to bound its own waits by; finish, called at least
  -- once below, bounds the transaction's idle time (limit_idle) before it returns.
  perform set_config('lock_timeout', v_lock_wait, true);
  -- Each attempt judged and applied by finish, in the order given.
  for i in 1 .. v_n loop
    attempt_id := finish_many.attempt_ids[i];
    outcome := pgfence_pgflow.finish(finish_many.attempt_ids[i], finish_many.kind,
                                     finish_many.outputs[i], finish_many.error_messages[i]);
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.finish_many(uuid[], text, jsonb[], text[]) is
  'complete_many (kind complete) and fail_many (kind fail): finish for each attempt, its rows locked first in one '
  'order across the batch. Raises 22023, 42501, 55P03.';

-- The two names of the contract (plpgsql without SET, every name qualified: its plan is kept,
-- where a LANGUAGE sql function returning a set would be planned per call).
create function pgfence_pgflow.complete_many(attempt_ids uuid[], outputs jsonb[] default null)
returns table (attempt_id uuid, outcome text)
language plpgsql
as $$
begin
  return query select * from pgfence_pgflow.finish_many($1, 'complete', $2, null);
end
$$;
comment on function pgfence_pgflow.complete_many(uuid[], jsonb[]) is
  'complete_task for each attempt of attempt_ids (with outputs[i], or NULL), by its rule: one row per id, in the order '
  'given, outcome accepted, duplicate or stale. Two batches over the same runs never deadlock: the later waits and is '
  'judged on what the earlier committed. Raises 22023, changing nothing, for a NULL or empty array, more than 1000 ids, '
  'a NULL or repeated id, outputs of another length, or any unknown attempt (pgfence.check_batch); 42501; 55P03 '
  '(retry) when another session holds one of its rows for over 5 s.';

create function pgfence_pgflow.fail_many(attempt_ids uuid[], error_messages text[] default null)
returns table (attempt_id uuid, outcome text)
language plpgsql
as $$
begin
  return query select * from pgfence_pgflow.finish_many($1, 'fail', null, $2);
end
$$;
comment on function pgfence_pgflow.fail_many(uuid[], text[]) is
  'fail_task for each attempt of attempt_ids (with error_messages[i]), by the rule of complete_many.';

revoke all on function pgfence_pgflow.finish_many(uuid[], text, jsonb[], text[]),
                       pgfence_pgflow.complete_many(uuid[], jsonb[]), pgfence_pgflow.fail_many(uuid[], text[])
  from public;
grant execute on function pgfence_pgflow.finish_many(uuid[], text, jsonb[], text[]),
                         pgfence_pgflow.complete_many(uuid[], jsonb[]), pgfence_pgflow.fail_many(uuid[], text[])
   to pgfence_worker;

commit;

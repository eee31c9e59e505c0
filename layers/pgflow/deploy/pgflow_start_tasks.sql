-- Deploy pgfence_pgflow:pgflow_start_tasks
-- requires: pgflow_attempts
--
-- Reworked in 0.3.1 (0.3.0's script is deploy/pgflow_start_tasks@v0.3.0.sql): a started task's
-- message stays hidden for the batch the start took, not only for its step's timeout + 2 s: vt
-- is the worker's hold of its batch (its handlers' deadline × qty, as the core's claim takes
-- it), so that no later task of a batch needs a set_vt before its handler unless a handler ran
-- long (issue 45). A vt shorter than the step's timeout + 2 s (the clients up to 0.3.0 send
-- the read's 2 s) leaves pgflow's rule as it was. The first change after 0.3.0: it refuses a
-- schema that another path (the one file, the CLI) moved (pgfence.expect_release).
--
-- 0.3.0's rework (0.2.1's script is deploy/pgflow_start_tasks@v0.2.1.sql): the worker's
-- row keyed by the core's pgfence.owner_ref (resource and owner can no longer meet: 'a/b' and
-- 'c' are not 'a' and 'b/c'), no pgfence.leases or pgfence.signing_key read here; a worker
-- starting under a new lease is alive again for pgflow (stopped_at cleared too); a task whose
-- message came back is taken over only when it has stalled (pgfence_pgflow.stalled: its step's
-- timeout + 2 s since its start, or its step's timeout and its attempt's lease ended), the
-- rule that the layer's stalled-task recovery applies too. Over 0.2 the table worker_leases is
-- there already (`if not exists`); a fresh install runs this script alone, after
-- pgflow_workers, whose functions name the table only in PL/pgSQL bodies.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';
-- (Over 0.2.0, "relation worker_leases already exists, skipping" says nothing useful.)
set local client_min_messages = warning;

do $$ begin perform pgfence.expect_release('pgfence_pgflow', '0.3.0'); end $$;

-- pgflow's worker row: pgflow records who started a task (step_tasks.last_worker_id) and
-- expects a pgflow.workers row for it. One row per worker, not per lease: its id is the core's
-- reference to the lease's owner (pgfence.owner_ref: a keyed hash of its resource and owner
-- name; a worker that acquires again, or supervises across leases, keeps its row), never the
-- lease id, which is the owner's capability and must not be readable there.
-- (dead since the core's owner_ref; nothing calls it)
-- squawk-ignore ban-drop-function
drop function if exists pgfence_pgflow.worker_id(uuid, bytea);

-- When a started task has stalled, so that someone else may take it over: its attempt can no
-- longer be accepted once its message is visible again after its step's timeout + 2 s (the
-- visibility the start gives it), or its attempt's lease has ended (not live: its worker can
-- no longer renew) and its step's timeout has passed. Before that, a result of the attempt is
-- valid, and nobody takes the task over: not the takeover of a read that got the message back
-- early (a hand, an old binary, pgflow's own recovery), not the layer's recovery job. timeout:
-- coalesce(the step's, the flow's), as the start uses; a start by pgflow's own worker has no
-- lease (NULL): its message's visibility alone decides. Judged on the transaction's clock,
-- now(): a long transaction sees less time passed, never more. Inlined (LANGUAGE sql, no SET,
-- every name qualified).
create or replace function pgfence_pgflow.stalled(started_at timestamptz, timeout int, visible boolean,
                                                  lease_live boolean)
returns boolean
language sql
stable
as $$
  select (stalled.visible
          and stalled.started_at operator(pg_catalog.<=)
              (pg_catalog.now() operator(pg_catalog.-) pg_catalog.make_interval(secs => (stalled.timeout operator(pg_catalog.+) 2))))
      or (not coalesce(stalled.lease_live, true)
          and stalled.started_at operator(pg_catalog.<=)
              (pg_catalog.now() operator(pg_catalog.-) pg_catalog.make_interval(secs => stalled.timeout)));
$$;
comment on function pgfence_pgflow.stalled(timestamptz, int, boolean, boolean) is
  'Whether a started task has stalled: visible again past its timeout + 2 s, or its attempt''s lease ended and its '
  'timeout passed.';
revoke all on function pgfence_pgflow.stalled(timestamptz, int, boolean, boolean) from public;

-- Whether the current start of a task, if it is the layer's, has a live lease (NULL when it is
-- not the layer's: pgflow's own worker started it).
create or replace function pgfence_pgflow.start_lease_live(run_id uuid, step_slug text, task_index int,
                                                          attempts_count int)
returns boolean
language sql
stable
as $$
  select f.live
    from pgfence_pgflow.attempts a, pgfence.lease_facts(array[a.lease_id]) f
   where a.run_id operator(pg_catalog.=) start_lease_live.run_id
     and a.step_slug operator(pg_catalog.=) start_lease_live.step_slug
     and a.task_index operator(pg_catalog.=) start_lease_live.task_index
     and a.attempts_count operator(pg_catalog.=) start_lease_live.attempts_count;
$$;
revoke all on function pgfence_pgflow.start_lease_live(uuid, text, int, int) from public;

-- Which lease each worker row last started under: the lease's end (superseded, draining,
-- released) is the worker's (pgflow's deprecated_at / stopped_at, pgfence_pgflow.sync_workers).
-- Holds lease ids: nobody but the layer's own functions reads it.
create table if not exists pgfence_pgflow.worker_leases (
  worker_id uuid primary key,
  lease_id  uuid not null
);
comment on table pgfence_pgflow.worker_leases is
  'The lease each pgflow.workers row of the layer last started under. Not a public interface.';
revoke all on table pgfence_pgflow.worker_leases from public;

create or replace function pgfence_pgflow.start_tasks(lease_id uuid, flow_slug text, queue text, vt interval, qty int default 1)
returns table (attempt_id uuid, run_id uuid, step_slug text, task_index int, input jsonb, msg_id bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_reads record;
  v_msgs bigint[];
  v_tasks pgflow.step_task_record[];
  v_task pgflow.step_task_record;
  v_worker uuid;
  v_resource text;
  v_flow_input boolean := exists (select from pg_catalog.pg_attribute a
                                   where a.attrelid = 'pgflow.step_task_record'::regclass
                                     and a.attname = 'flow_input' and not a.attisdropped);
begin
  -- The NULL checks are the core's, called only where they fail: a call per start costs a
  -- statement of its own.
  if start_tasks.lease_id is null then
    perform pgfence.check_not_null('lease_id', start_tasks.lease_id);
  end if;
  perform pgfence_pgflow.check_allowed('pgflow.start_tasks(text, bigint[], uuid)');
  if not exists (select from pgflow.flows f where f.flow_slug = start_tasks.flow_slug) then
    perform pgfence.invalid_argument('flow_slug', 'no such pgflow flow', start_tasks.flow_slug);
  end if;
  -- pgflow queues a flow's tasks on the queue named after the flow, and its start_tasks sets
  -- the visibility of messages of that queue only.
  if start_tasks.queue is distinct from start_tasks.flow_slug then
    perform pgfence.invalid_argument('queue', 'must be the flow''s queue, named as the flow', start_tasks.queue);
  end if;
  -- The fenced read (pgmq layer): only under the resource's current lease, held to the end of
  -- this transaction, which it marks fenced for the resource, so the writes below (and
  -- pgflow's own) pass the guards of a protected step_tasks and queue table.
  select array_agg(r.msg_id order by r.msg_id) as msgs, array_agg(r.attempt_id order by r.msg_id) as attempts
    into v_reads
    from pgfence_pgmq.read(start_tasks.lease_id, start_tasks.queue, start_tasks.vt, start_tasks.qty) r;
  if v_reads.msgs is null then
    return;
  end if;
  v_msgs := v_reads.msgs;
  -- The worker row pgflow's start_tasks refers to, and its heartbeat, at most every 5 seconds:
  -- an upsert locks the row to the end of the transaction, and would queue every start of
  -- the lease behind the one before. A worker that starts under a new lease is alive again.
  select o.resource, o.ref into v_resource, v_worker from pgfence.owner_ref(start_tasks.lease_id, 'pgflow worker') o;
  -- (stopped_at: pgflow 0.9 and later; a worker's row read whole, so that 0.8's has none.)
  if not exists (select from pgflow.workers w
                   join pgfence_pgflow.worker_leases wl on wl.worker_id = w.worker_id
                  where w.worker_id = v_worker and wl.lease_id = start_tasks.lease_id
                    and w.deprecated_at is null and (to_jsonb(w) ->> 'stopped_at') is null
                    and w.last_heartbeat_at > now() - interval '5 seconds') then
    insert into pgflow.workers as w (worker_id, queue_name, function_name)
    values (v_worker, start_tasks.queue, v_resource)
    on conflict (worker_id) do update set last_heartbeat_at = now(), deprecated_at = null;
    if exists (select from pg_attribute a where a.attrelid = 'pgflow.workers'::regclass
                                             and a.attname = 'stopped_at' and not a.attisdropped) then
      execute 'update pgflow.workers w set stopped_at = null where w.worker_id = $1 and w.stopped_at is not null'
        using v_worker;
    end if;
    insert into pgfence_pgflow.worker_leases as wl (worker_id, lease_id)
    values (v_worker, start_tasks.lease_id)
    on conflict (worker_id) do update set lease_id = excluded.lease_id
     where wl.lease_id is distinct from excluded.lease_id;
  end if;
  -- The takeover. pgflow starts only queued tasks; a task whose message came back while it is
  -- still started, and that has stalled (pgfence_pgflow.stalled), was started by an attempt
  -- that never finished it (its worker died, or was paused past its lease and its message's
  -- visibility, which the start below sets to the step's timeout + 2 s): that attempt no
  -- longer holds the message, so the task goes back to queued and pgflow's start_tasks below
  -- starts it again for this read, raising attempts_count, which makes the old attempt's
  -- result stale. Only a task whose message this read got back: any other started task (this
  -- worker's own earlier start, of another run) is live. One whose message came back early
  -- (within its step's timeout, its worker alive) stays its attempt's: pgflow does not start it
  -- again, and its message is hidden again below for what its start gave it.
  update pgflow.step_tasks st
     set status = 'queued', started_at = null
    from pgflow.steps s join pgflow.flows f on f.flow_slug = s.flow_slug
   where s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     and st.flow_slug = start_tasks.flow_slug and st.message_id = any (v_msgs) and st.status = 'started'
     and st.attempts_count < coalesce(s.opt_max_attempts, f.opt_max_attempts)
     and pgfence_pgflow.stalled(st.started_at, coalesce(s.opt_timeout, f.opt_timeout), true,
                                pgfence_pgflow.start_lease_live(st.run_id, st.step_slug, st.task_index,
                                                                st.attempts_count));
  -- A takeover counts against pgflow's max_attempts: a stalled task with no attempt left fails
  -- for good, by pgflow's own fail_task (which fails its run). fail_task locks the run, which a
  -- result of the run takes first (finish): a run locked by a result in flight is left for a
  -- later read (SKIP LOCKED), so the two never wait for each other in opposite orders.
  perform pgflow.fail_task(st.run_id, st.step_slug, st.task_index,
                           pg_catalog.format('pgfence: taken over after %s attempts (max_attempts): '
                                             'its worker stalled past the step''s timeout', st.attempts_count))
     from pgflow.step_tasks st
     join pgflow.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     join pgflow.flows f on f.flow_slug = s.flow_slug
   where st.flow_slug = start_tasks.flow_slug and st.message_id = any (v_msgs) and st.status = 'started'
     and st.attempts_count >= coalesce(s.opt_max_attempts, f.opt_max_attempts)
     and pgfence_pgflow.stalled(st.started_at, coalesce(s.opt_timeout, f.opt_timeout), true,
                                pgfence_pgflow.start_lease_live(st.run_id, st.step_slug, st.task_index,
                                                                st.attempts_count))
     and exists (select from pgflow.runs r where r.run_id = st.run_id for update skip locked);
  -- A live task whose message came back early: hidden again until its start's deadline (its
  -- step's timeout + 2 s from its start), not for this read's vt.
  perform pgmq.set_vt(start_tasks.queue, st.message_id,
                      greatest(1, ceil(date_part('epoch', st.started_at + make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 2)
                                                          - clock_timestamp())))::int)
     from pgflow.step_tasks st
     join pgflow.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     join pgflow.flows f on f.flow_slug = s.flow_slug
   where st.flow_slug = start_tasks.flow_slug and st.message_id = any (v_msgs) and st.status = 'started';
  select array_agg(t order by t.msg_id) into v_tasks
    from pgflow.start_tasks(start_tasks.flow_slug, v_msgs, v_worker) t;
  -- pgflow's own rule, on every supported pgflow: a started task's message stays hidden for its
  -- step's timeout (else the flow's) + 2 s, whatever vt the read used, so that no live task is
  -- taken over while its handler may still run. pgflow 0.8.1's start_tasks states it but never
  -- applies it (its set_vt_batch is an unreferenced CTE, which PostgreSQL does not run). Longer
  -- when the worker holds its batch longer (vt: its handlers' deadline × qty, one after
  -- another), so that a later task of the batch is still hidden when its handler starts; the
  -- price is liveness: a dead worker's tasks come back when its hold runs out.
  perform pgmq.set_vt(start_tasks.queue, t.msg_id,
                      greatest(coalesce(s.opt_timeout, f.opt_timeout) + 2, ceil(extract(epoch from start_tasks.vt))::int))
     from unnest(v_tasks) t
     join pgflow.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
     join pgflow.flows f on f.flow_slug = t.flow_slug;
  -- Each started task's attempt, recorded and returned, in msg_id order: a statement per task
  -- (one statement over unnest() of the arrays was planned anew on every call), each of its
  -- own, so that it sees the attempts_count pgflow's start just set.
  foreach v_task in array coalesce(v_tasks, '{}') loop
    insert into pgfence_pgflow.attempts as a
           (attempt_id, pgmq_attempt_id, flow_slug, run_id, step_slug, task_index, msg_id, attempts_count, lease_id)
    select gen_random_uuid(), v_reads.attempts[array_position(v_msgs, v_task.msg_id)], v_task.flow_slug,
           v_task.run_id, v_task.step_slug, v_task.task_index, v_task.msg_id, st.attempts_count, start_tasks.lease_id
      from pgflow.step_tasks st
     where st.run_id = v_task.run_id and st.step_slug = v_task.step_slug and st.task_index = v_task.task_index
       and v_task.msg_id = any (v_msgs)
    returning a.attempt_id into attempt_id;
    continue when not found;
    -- input has pgflow 0.8's shape on every pgflow: a map task's item; any other task's run
    -- input under "run" beside its dependencies' outputs. pgflow since its flow_input
    -- migration (20251225163110; 0.14.1 has it) gives a task its dependencies' outputs only (a
    -- root step's flow_input aside, which its own workers read), so the run's input is put back
    -- under "run" there. (Only there a statement: on 0.8 the input is pgflow's as it is.)
    input := v_task.input;
    if v_flow_input then
      input :=
         case when v_flow_input and (select st2.step_type from pgflow.steps st2
                                      where st2.flow_slug = v_task.flow_slug and st2.step_slug = v_task.step_slug)
                                    is distinct from 'map'
              then pg_catalog.jsonb_build_object('run', (select r2.input from pgflow.runs r2 where r2.run_id = v_task.run_id))
                   operator(pg_catalog.||) v_task.input
              else v_task.input end;
    end if;
    run_id := v_task.run_id;
    step_slug := v_task.step_slug;
    task_index := v_task.task_index;
    msg_id := v_task.msg_id;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.start_tasks(uuid, text, text, interval, int) is
  'Reads up to qty messages of the flow''s queue under the resource''s active, unexpired lease (pgfence_pgmq.read, which checks the caller may read the queue) '
  'and starts their tasks with pgflow''s own start_tasks, in one transaction; a started task''s message stays hidden for '
  'its step''s timeout + 2 s, or vt when longer (the worker''s hold of its batch); a task still started by an attempt whose message came back is taken over, or failed for '
  'good when it has no attempt left (max_attempts). Raises PF001, 42501 (the caller''s role may not do this with pgflow and pgmq '
  'themselves), 22023.';

revoke all on function pgfence_pgflow.start_tasks(uuid, text, text, interval, int) from public;
grant execute on function pgfence_pgflow.start_tasks(uuid, text, text, interval, int) to pgfence_worker;

commit;

-- Deploy pgfence_pgflow:pgflow_windows
-- requires: pgflow_schema
--
-- 0.3.0: update windows over pgflow worker functions whose workers are not converted to
-- pgfence (not pgfence resources: pgflow's own EdgeWorker). The worker-update seed asks for
-- exact-state preservation of worker_functions.enabled and deprecating workers through
-- pgflow.workers.deprecated_at, and says that strict ownership is not a prerequisite for
-- wrapping pgflow's cooperative behaviour honestly. pgfence.prepare_update offers the layer the
-- names of its set that are no resources (the core's window_prepare hook); the layer keeps
-- them here, and the core's update_status and finish_update ask it (window_status,
-- window_finish). Converted and unconverted functions mix in one window.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One row per worker function a window took: its exact enabled before the window (restored by
-- finish_update, as the core restores a resource's), whether someone set it inside the window
-- (an operator's newer decision: finish leaves it), and the outcome once finished. A function
-- belongs to at most one open window.
create table pgfence_pgflow.windows (
  token         uuid not null,
  function_name text not null,
  saved_enabled boolean not null,
  changed       boolean not null default false,
  prepared_at   timestamptz not null default clock_timestamp(),
  outcome       text check (outcome in ('restored', 'kept_disabled', 'conflict')),
  primary key (token, function_name)
);
comment on table pgfence_pgflow.windows is
  'The pgflow worker functions (no pgfence resources) in update windows, and what each had before. Not a public '
  'interface: pgfence.update_status shows them.';
create unique index windows_one_open on pgfence_pgflow.windows (function_name) where outcome is null;
revoke all on table pgfence_pgflow.windows from public;

-- The core's window_prepare hook: of names (none of them a pgfence resource), the pgflow
-- worker functions, taken into window token by the rules of the core's own windows: the
-- function rows locked in name order (waited for at most 5 s: 55P03), one open window per
-- function (PF004 otherwise), each one's exact enabled saved and then set false (pgflow pings
-- it no more), and its live workers marked deprecated_at, pgflow's cooperative drain: a worker
-- sees it at its next check and starts nothing more. A worker deprecated before the window
-- keeps its mark. Nothing of a runtime is stopped: a worker may still finish what it started.
create function pgfence_pgflow.window_prepare(token uuid, names text[])
returns setof text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_names text[];
  v_open text;
  v_lock_wait text;
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is null then
    return;  -- pgflow 0.8 registers no worker functions
  end if;
  v_lock_wait := pgfence.limit_lock_wait();
  select array_agg(x.function_name order by x.function_name) into v_names
    from (select wf.function_name from pgflow.worker_functions wf
           where wf.function_name = any (window_prepare.names)
           order by wf.function_name
             for update) x;
  perform set_config('lock_timeout', v_lock_wait, true);
  if v_names is null then
    return;
  end if;
  select string_agg(format('%s (update ref %s)', w.function_name, pgfence.ref(w.token)), ', ' order by w.function_name)
    into v_open
    from pgfence_pgflow.windows w
   where w.function_name = any (v_names) and w.outcome is null;
  if v_open is not null then
    raise exception 'pgfence: pgflow worker functions already in an open update: %', v_open
      using errcode = 'PF004', hint = 'finish that update first: pgfence.finish_update(token)';
  end if;
  insert into pgfence_pgflow.windows (token, function_name, saved_enabled)
  select window_prepare.token, wf.function_name, wf.enabled
    from pgflow.worker_functions wf where wf.function_name = any (v_names);
  -- The window's own change, which follow_resource does not count as someone else's.
  perform set_config('pgfence_pgflow.window', 'on', true);
  update pgflow.worker_functions wf set enabled = false where wf.function_name = any (v_names) and wf.enabled;
  perform set_config('pgfence_pgflow.window', '', true);
  update pgflow.workers w set deprecated_at = clock_timestamp()
   where w.function_name = any (v_names) and w.deprecated_at is null and w.stopped_at is null;
  return query select unnest(v_names);
end
$$;
comment on function pgfence_pgflow.window_prepare(uuid, text[]) is
  'pgfence.layers: takes the pgflow worker functions of names into update window token: saves and pauses each one''s '
  'enabled, marks its live workers deprecated_at. Raises PF004, 55P03.';

-- The core's window_status hook: one row per function of window token the layer took, what was
-- observed, never a claim that a runtime stopped. Each worker (pgflow.workers) that is live (not
-- stopped, a heartbeat within the function's debounce: pgflow's own test of a live worker),
-- holds started tasks (step_tasks.last_worker_id), or has been seen since the window opened,
-- with its heartbeat, its marks and its started tasks; pending: a ping within the last minute
-- that no worker has registered since (a start under way). drained: no started task and no
-- live worker and no start pending; unknown: a silent worker (not live) still holds started
-- tasks, and nobody can tell whether its handler stopped; draining otherwise; finished once
-- restored. For the window's other names (names) that are pgflow worker functions (pgfence
-- resources: the core has their rows), their workers alone, the verdict NULL: a converted
-- worker's row too (a FlowWorker process, say), with its heartbeat.
create function pgfence_pgflow.window_status(token uuid, names text[])
returns table (resource text, saved_enabled boolean, enabled boolean, verdict text, heartbeat timestamptz,
               in_flight jsonb, pending bigint, workers jsonb)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is null then
    return;
  end if;
  return query
  with items as (
    select w.function_name, true as own, w.saved_enabled, w.outcome, w.prepared_at
      from pgfence_pgflow.windows w
     where w.token = window_status.token
    union all
    select n, false, null, null, u.prepared_at
      from unnest(window_status.names) n, pgfence.updates u
     where u.token = window_status.token
       and not exists (select from pgfence_pgflow.windows w where w.token = window_status.token and w.function_name = n)
       and exists (select from pgflow.worker_functions wf where wf.function_name = n))
  select w.function_name, w.saved_enabled, case when w.own then wf.enabled end,
         case when not w.own then null
              when w.outcome is not null then 'finished'
              when k.silent > 0 then 'unknown'
              when k.live > 0 or k.started > 0 or p.pending > 0 then 'draining'
              else 'drained' end,
         k.heartbeat, case when w.own then jsonb_build_object('pgflow', k.started) end,
         case when w.own then p.pending end, k.workers
    from items w
    left join pgflow.worker_functions wf on wf.function_name = w.function_name
    cross join lateral (
      select count(*) filter (where x.live) as live,
             coalesce(sum(x.started), 0)::bigint as started,
             coalesce(sum(x.started) filter (where not x.live), 0)::bigint as silent,
             max(x.last_heartbeat_at) as heartbeat,
             coalesce(jsonb_agg(jsonb_build_object('worker_id', x.worker_id, 'started_at', x.started_at,
                                                   'last_heartbeat_at', x.last_heartbeat_at,
                                                   'deprecated_at', x.deprecated_at, 'stopped_at', x.stopped_at,
                                                   'live', x.live, 'started_tasks', x.started)
                                order by x.started_at, x.worker_id), '[]') as workers
        from (select pw.worker_id, pw.started_at, pw.last_heartbeat_at, pw.deprecated_at, pw.stopped_at,
                     pw.stopped_at is null
                       and pw.last_heartbeat_at > now() - coalesce(wf.debounce, interval '6 seconds') as live,
                     (select count(*) from pgflow.step_tasks st
                       where st.last_worker_id = pw.worker_id and st.status = 'started') as started
                from pgflow.workers pw
               where pw.function_name = w.function_name) x
       where x.live or x.started > 0 or x.last_heartbeat_at >= w.prepared_at) k
    cross join lateral (
      select count(*) as pending
        where wf.last_invoked_at > now() - interval '1 minute'
          and not exists (select from pgflow.workers pw
                           where pw.function_name = w.function_name and pw.started_at >= wf.last_invoked_at)) p;
end
$$;
comment on function pgfence_pgflow.window_status(uuid, text[]) is
  'pgfence.layers: update_status''s rows for the pgflow worker functions of window token: saved and current enabled, '
  'the verdict (drained, draining, unknown, finished), each worker with its heartbeat and started tasks, pending starts; '
  'and the workers of its other names that are pgflow worker functions (verdict NULL).';

-- The core's window_finish hook: restores exactly what window token saved, by the core's rules:
-- restored (it was enabled), kept_disabled (it was disabled before the window: nothing enables
-- itself), conflict (someone set enabled inside the window, or removed the function: theirs is
-- the newer decision, left as it is), already_finished (idempotent).
create function pgfence_pgflow.window_finish(token uuid)
returns table (resource text, enabled boolean, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_item record;
  v_outcome text;
  v_lock_wait text;
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is null then
    return;
  end if;
  v_lock_wait := pgfence.limit_lock_wait();
  perform from pgflow.worker_functions wf
   where wf.function_name in (select w.function_name from pgfence_pgflow.windows w where w.token = window_finish.token)
   order by wf.function_name
     for update;
  perform set_config('lock_timeout', v_lock_wait, true);
  for v_item in
    select w.function_name, w.saved_enabled, w.changed, w.outcome, wf.function_name is not null as present
      from pgfence_pgflow.windows w left join pgflow.worker_functions wf on wf.function_name = w.function_name
     where w.token = window_finish.token
     order by w.function_name
       for update of w
  loop
    if v_item.outcome is not null then
      v_outcome := 'already_finished';
    elsif v_item.changed or not v_item.present then
      v_outcome := 'conflict';
    elsif v_item.saved_enabled then
      perform set_config('pgfence_pgflow.window', 'on', true);
      update pgflow.worker_functions wf set enabled = true where wf.function_name = v_item.function_name;
      perform set_config('pgfence_pgflow.window', '', true);
      v_outcome := 'restored';
    else
      v_outcome := 'kept_disabled';
    end if;
    if v_outcome <> 'already_finished' then
      update pgfence_pgflow.windows w set outcome = v_outcome
       where w.token = window_finish.token and w.function_name = v_item.function_name;
    end if;
    resource := v_item.function_name;
    enabled := (select wf.enabled from pgflow.worker_functions wf where wf.function_name = v_item.function_name);
    outcome := v_outcome;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.window_finish(uuid) is
  'pgfence.layers: restores the pgflow worker functions of window token exactly: restored, kept_disabled, conflict or '
  'already_finished.';

revoke all on function pgfence_pgflow.window_prepare(uuid, text[]), pgfence_pgflow.window_status(uuid, text[]),
                       pgfence_pgflow.window_finish(uuid)
  from public;
update pgfence.layers
   set window_prepare = 'pgfence_pgflow.window_prepare(uuid, text[])'::regprocedure::text,
       window_status = 'pgfence_pgflow.window_status(uuid, text[])'::regprocedure::text,
       window_finish = 'pgfence_pgflow.window_finish(uuid)'::regprocedure::text
 where schema_name = 'pgfence_pgflow';

commit;

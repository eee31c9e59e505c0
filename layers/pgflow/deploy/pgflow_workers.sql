-- Deploy pgfence_pgflow:pgflow_workers
-- requires: pgflow_start_tasks
-- requires: pgflow_windows
--
-- pgflow's own worker registration as pgfence's (pgflow 0.9 and later: worker_functions,
-- ensure_workers, workers.stopped_at; on 0.8 only what it has): worker_functions follow
-- pgfence's resources, workers are started through the startup handshake, the workers of an
-- ended lease are marked so, and pgflow's maintenance runs under `enforce`.
--
-- Reworked in 0.3.0 (0.2.1's script is deploy/pgflow_workers@v0.2.1.sql):
-- - worker_functions follow the resources through the core's enabled_changed hook
--   (pgfence.layers) instead of a trigger on pgfence.resources, which the core never saw;
-- - a worker function that is no pgfence resource keeps pgflow's own behaviour: the layer's
--   ensure_workers pings it by pgflow's rule, its recovery requeues its tasks by pgflow's rule;
-- - stalled-task recovery never takes over a task whose attempt can still be accepted
--   (pgfence_pgflow.stalled, the takeover's rule): pgflow's own used the flow's timeout + 30 s
--   whatever the step's;
-- - a function is pinged only under a name that is one segment of a URL path;
-- - no pgfence.leases or pgfence.signing_key read here (pgfence.lease_facts, mark_guards).
-- setup_cron moved to pgflow_cron.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';
-- (Over 0.2, "trigger ... does not exist, skipping" says nothing useful.)
set local client_min_messages = warning;

-- worker_functions.enabled follows pgfence's resources.enabled: a function that is a pgfence
-- resource is pinged exactly while its resource is enabled, so an update window (which
-- disables the resource, then restores exactly what it saved) disables and restores it
-- exactly, and nobody enables it past pgfence (I6). A row pgflow writes (track_worker_function
-- on a worker's start, or an update by hand) takes the resource's enabled (this trigger); a
-- change of the resource is passed on by the core (enabled_changed, below). A function of an
-- open window of the layer's own (an unconverted one, pgfence_pgflow.windows) stays paused if
-- its row is made again, and a change of its enabled by anyone but the window is an operator's
-- decision, which finish_update then leaves as it is (changed).
create or replace function pgfence_pgflow.follow_resource()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  new.enabled := coalesce((select r.enabled from pgfence.resources r where r.resource = new.function_name),
                          new.enabled);
  if exists (select from pgfence_pgflow.windows w where w.function_name = new.function_name and w.outcome is null) then
    if tg_op = 'INSERT' then
      new.enabled := false;
    elsif coalesce(current_setting('pgfence_pgflow.window', true), '') = '' then
      update pgfence_pgflow.windows w set changed = true
       where w.function_name = new.function_name and w.outcome is null;
    end if;
  end if;
  return new;
end
$$;
revoke all on function pgfence_pgflow.follow_resource() from public;

-- The core's enabled_changed hook: the resources whose enabled just changed (register, set_enabled,
-- prepare_update, finish_update), in their transaction.
create or replace function pgfence_pgflow.enabled_changed(resources text[])
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  -- pgflow 0.8 has no worker_functions.
  if pg_catalog.to_regclass('pgflow.worker_functions') is not null then
    execute 'update pgflow.worker_functions wf set enabled = r.enabled from pgfence.resources r
              where r.resource = wf.function_name and r.resource = any ($1) and wf.enabled is distinct from r.enabled'
      using enabled_changed.resources;
  end if;
end
$$;
comment on function pgfence_pgflow.enabled_changed(text[]) is
  'pgfence.layers: pgflow''s worker_functions.enabled follows the resources whose enabled changed.';
revoke all on function pgfence_pgflow.enabled_changed(text[]) from public;

drop trigger if exists pgfence_pgflow_worker_functions on pgfence.resources;
update pgfence.layers set enabled_changed = 'pgfence_pgflow.enabled_changed(text[])'::regprocedure::text
 where schema_name = 'pgfence_pgflow';
do $$
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is not null then
    execute 'create or replace trigger pgfence_follow_resource before insert or update of enabled, function_name
               on pgflow.worker_functions for each row execute function pgfence_pgflow.follow_resource()';
    execute 'update pgflow.worker_functions wf set enabled = r.enabled from pgfence.resources r
              where r.resource = wf.function_name and wf.enabled is distinct from r.enabled';
  end if;
end
$$;

-- The workers of an ended lease, as pgflow knows them: a worker whose last lease was
-- superseded or drained is deprecated (pgflow's "stop starting, finish what is in hand"), one
-- whose lease was released has stopped (pgflow 0.9+: stopped_at). ensure_workers then sees no
-- live worker there, and pgflow's own tools show the truth.
create or replace function pgfence_pgflow.sync_workers()
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_leases uuid[] := array(select wl.lease_id from pgfence_pgflow.worker_leases wl);
  v_rows bigint;
  v_stopped bigint := 0;
begin
  update pgflow.workers w set deprecated_at = clock_timestamp()
    from pgfence_pgflow.worker_leases wl join pgfence.lease_facts(v_leases) l on l.lease_id = wl.lease_id
   where wl.worker_id = w.worker_id and w.deprecated_at is null
     and l.status in ('superseded', 'draining');
  get diagnostics v_rows = row_count;
  if exists (select from pg_catalog.pg_attribute a
              where a.attrelid = 'pgflow.workers'::regclass and a.attname = 'stopped_at' and not a.attisdropped) then
    execute 'update pgflow.workers w set stopped_at = clock_timestamp()
               from pgfence_pgflow.worker_leases wl join pgfence.lease_facts($1) l on l.lease_id = wl.lease_id
              where wl.worker_id = w.worker_id and w.stopped_at is null and l.status = ''released'''
      using v_leases;
    get diagnostics v_stopped = row_count;
  end if;
  return v_rows + v_stopped;
end
$$;
comment on function pgfence_pgflow.sync_workers() is
  'Marks the pgflow.workers rows of the layer whose last lease was superseded or drained deprecated_at, '
  'and those whose lease was released stopped_at (pgflow 0.9+); returns how many.';

-- pgflow 0.14's ensure_workers, through the startup handshake: a worker function that is a
-- pgfence resource is pinged only when pgfence.request_start returns an invocation id (the
-- resource is enabled, no lease is current, no invocation is pending: exactly one per
-- window), and that id is sent in the request's body, {"invocation_id": "..."}, for the
-- function to acquire with (Owner.acquire(invocationId), FlowWorker.start's invocationId).
-- A worker function that is no pgfence resource is pinged by pgflow's own rule (every enabled
-- one locally; else one whose debounce has passed and that has no live worker: not stopped,
-- not deprecated, a heartbeat within the debounce), with pgflow's empty body: the layer's job
-- serves both, so that pgflow's own job can call the layer. pgflow's debounce, URL and
-- credentials are kept (Vault's supabase_project_id, pgflow_auth_secret or
-- supabase_service_role_key; kong locally). A name is put into the URL only if it is one path
-- segment (letters, digits, _ and -, as Supabase names Edge Functions): one with '/' or '..'
-- (a resource may be named so, and registering one is a worker's right) would steer the ping,
-- with its credentials, elsewhere; it is never pinged. The cron job pgflow schedules is
-- pointed here by pgfence_pgflow.setup_cron().
create or replace function pgfence_pgflow.ensure_workers()
returns table (function_name text, invoked boolean, request_id bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  c_segment constant text := '^[A-Za-z0-9_-]+$';
  v_local boolean;
  v_key text;
  v_base text;
  v_fn record;
  v_invocation uuid;
begin
  perform pgfence_pgflow.sync_workers();
  v_local := pgflow.is_local();
  if v_local then
    v_base := 'http://kong:8000/functions/v1';
  else
    select coalesce(nullif((select s.decrypted_secret from vault.decrypted_secrets s where s.name = 'pgflow_auth_secret'), ''),
                    nullif((select s.decrypted_secret from vault.decrypted_secrets s where s.name = 'supabase_service_role_key'), '')),
           (select 'https://' || nullif(s.decrypted_secret, '') || '.supabase.co/functions/v1'
              from vault.decrypted_secrets s where s.name = 'supabase_project_id')
      into v_key, v_base;
    if v_base is null or v_key is null then
      return;
    end if;
  end if;
  for v_fn in
    select wf.function_name, r.resource is not null as fenced
      from pgflow.worker_functions wf left join pgfence.resources r on r.resource = wf.function_name
     where wf.enabled and coalesce(r.enabled, true) and wf.function_name ~ c_segment
       and (v_local or wf.last_invoked_at is null or wf.last_invoked_at < now() - wf.debounce)
       and (r.resource is not null or v_local
            or not exists (select from pgflow.workers w
                            where w.function_name = wf.function_name and w.stopped_at is null
                              and w.deprecated_at is null and w.last_heartbeat_at > now() - wf.debounce))
     order by wf.function_name
       for update of wf skip locked
  loop
    if v_fn.fenced then
      v_invocation := pgfence.request_start(v_fn.function_name);
      continue when v_invocation is null;
    end if;
    function_name := v_fn.function_name;
    invoked := true;
    request_id := net.http_post(
      url => v_base || '/' || v_fn.function_name,
      headers => case when v_local then '{}'::jsonb
                      else jsonb_build_object('Content-Type', 'application/json', 'Authorization', 'Bearer ' || v_key) end,
      body => case when v_fn.fenced then jsonb_build_object('invocation_id', v_invocation) else '{}'::jsonb end);
    update pgflow.worker_functions wf set last_invoked_at = clock_timestamp()
     where wf.function_name = v_fn.function_name;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.ensure_workers() is
  'pgflow''s ensure_workers, through the startup handshake for a worker function that is a pgfence resource (pinged '
  'only when pgfence.request_start returns an invocation id, which it sends: {"invocation_id": ...}), by pgflow''s own '
  'rule for any other; never under a name that is not one URL path segment. pgflow 0.9+.';

-- pgflow's maintenance under `enforce`: its writes of step_tasks and the queue tables (a stalled
-- task put back, a message made visible or archived; deleting a worker row sets
-- step_tasks.last_worker_id to NULL), which the guards of a protected table refuse without a
-- fence, run with the transaction shown as fenced for the resources of the guards
-- (pgfence.mark_guards), for this call alone.
create or replace function pgfence_pgflow.as_maintenance(fn text, arg interval default null)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_was text := pgfence.mark_guards(array(select c.oid::regclass from pg_class c
                                           where c.relnamespace = 'pgmq'::regnamespace and c.relname like 'q\_%')
                                     || 'pgflow.step_tasks'::regclass);
  v_flow text;
  v_task record;
  v_rows bigint := 0;
  v_n bigint;
begin
  if fn = 'requeue' then
    -- The layer's starts (their current start is an attempt of the layer's): a stalled one
    -- (pgfence_pgflow.stalled, the takeover's rule: never one whose attempt can still be
    -- accepted) whose message is still hidden, because its attempt's lease ended and the
    -- step's timeout passed, is made visible at once; the next read takes it over (or fails it
    -- for good when it has no attempt left), by the layer's one rule. One that is visible
    -- again already waits for that read. Locked rows (a result being applied) are skipped.
    for v_flow in select distinct st.flow_slug from pgflow.step_tasks st where st.status = 'started' loop
      continue when pg_catalog.to_regclass(format('pgmq.%I', lower('q_' || v_flow))) is null;
      for v_task in execute format(
        'select st.message_id
           from pgflow.step_tasks st
           join pgflow.steps s on s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
           join pgflow.flows f on f.flow_slug = s.flow_slug
           join pgfence_pgflow.attempts a
             on a.run_id = st.run_id and a.step_slug = st.step_slug and a.task_index = st.task_index
            and a.attempts_count = st.attempts_count and a.outcome is null
           join pgmq.%I m on m.msg_id = st.message_id
           left join lateral pgfence.lease_facts(array[a.lease_id]) l on true
          where st.flow_slug = $1 and st.status = ''started'' and m.vt > now()
            and pgfence_pgflow.stalled(st.started_at, coalesce(s.opt_timeout, f.opt_timeout), m.vt <= now(), l.live)
            for update of st skip locked', lower('q_' || v_flow))
        using v_flow
      loop
        perform pgmq.set_vt(v_flow, v_task.message_id, 0);
        v_rows := v_rows + 1;
      end loop;
    end loop;
    -- Any other started task (started by pgflow's own worker: a function that is no pgfence
    -- resource, or an old binary) keeps pgflow's own recovery (0.13 and later, which has it):
    -- started more than its flow's timeout + 30 s ago, it goes back to queued with its message
    -- visible at once, at most 3 times; then it is marked permanently stalled and its message
    -- archived.
    if exists (select from pg_catalog.pg_attribute a
                where a.attrelid = 'pgflow.step_tasks'::regclass and a.attname = 'permanently_stalled_at'
                  and not a.attisdropped) then
      execute $q$
        with stalled as (
          select st.run_id, st.step_slug, st.task_index, st.message_id, st.flow_slug, st.requeued_count
            from pgflow.step_tasks st
            join pgflow.flows f on f.flow_slug = st.flow_slug
           where st.status = 'started' and st.permanently_stalled_at is null
             and st.started_at < now() - make_interval(secs => f.opt_timeout) - interval '30 seconds'
             and not exists (select from pgfence_pgflow.attempts a
                              where a.run_id = st.run_id and a.step_slug = st.step_slug
                                and a.task_index = st.task_index and a.attempts_count = st.attempts_count)
             for update of st skip locked),
        requeued as (
          update pgflow.step_tasks st
             set status = 'queued', started_at = null, last_worker_id = null,
                 requeued_count = st.requeued_count + 1, last_requeued_at = now()
            from stalled x
           where x.requeued_count < 3
             and st.run_id = x.run_id and st.step_slug = x.step_slug and st.task_index = x.task_index
          returning x.flow_slug, x.message_id),
        given_up as (
          update pgflow.step_tasks st set permanently_stalled_at = now()
            from stalled x
           where x.requeued_count >= 3
             and st.run_id = x.run_id and st.step_slug = x.step_slug and st.task_index = x.task_index
          returning x.flow_slug, x.message_id)
        select (select count(*) from requeued)
               + 0 * (select count(*) from requeued r, lateral pgmq.set_vt(r.flow_slug, r.message_id, 0) v
                       where r.message_id is not null)
               + 0 * (select count(*) from given_up g, lateral pgmq.archive(g.flow_slug, g.message_id) v
                       where g.message_id is not null)$q$
        into v_n;
      v_rows := v_rows + v_n;
    end if;
  else
    -- The ended worker rows, older than the bound: no heartbeat since arg ago and no task of
    -- theirs still started; of the layer's rows (worker_leases) only those whose last lease
    -- has ended (released, superseded, or past its expiry), never a live worker's, whose
    -- heartbeat is only as recent as its last start (an idle worker's row is old). sync_workers
    -- first, so that what pgflow shows (deprecated_at / stopped_at) agrees with what goes.
    perform pgfence_pgflow.sync_workers();
    delete from pgflow.workers w
     where w.last_heartbeat_at < now() - arg
       and not exists (select from pgflow.step_tasks st where st.last_worker_id = w.worker_id and st.status = 'started')
       and not exists (select from pgfence_pgflow.worker_leases wl
                         join pgfence.lease_facts(array[wl.lease_id]) l on l.lease_id = wl.lease_id
                        where wl.worker_id = w.worker_id and l.live);
    get diagnostics v_rows = row_count;
    delete from pgfence_pgflow.worker_leases wl
     where not exists (select from pgflow.workers w where w.worker_id = wl.worker_id);
  end if;
  perform set_config('pgfence.fenced', v_was, true);
  return v_rows;
end
$$;
revoke all on function pgfence_pgflow.as_maintenance(text, interval) from public;

create or replace function pgfence_pgflow.requeue_stalled_tasks()
returns integer
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select pgfence_pgflow.as_maintenance('requeue')::int;
$$;
comment on function pgfence_pgflow.requeue_stalled_tasks() is
  'Stalled-task recovery, also where step_tasks and the queues are protected in enforce mode: a layer''s start that '
  'has stalled (its attempt''s lease ended past its step''s timeout) gets its message back at once, for the next read '
  'to take over; never one whose attempt can still be accepted. Other starts (pgflow''s own workers) by pgflow''s own '
  'rule (0.13+). Returns how many.';

create or replace function pgfence_pgflow.prune_workers(older_than interval default '7 days')
returns table (what text, rows bigint)
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select 'pgflow.workers'::text, pgfence_pgflow.as_maintenance('prune', prune_workers.older_than);
$$;
comment on function pgfence_pgflow.prune_workers(interval) is
  'Deletes the ended pgflow.workers rows: no heartbeat for older_than, no task started, and for the layer''s rows '
  'a last lease that has ended (never a live worker''s row), also under enforce. pgfence_pgflow.prune (the layer''s '
  'prune in pgfence.layers, run by pgfence.prune) calls it.';

revoke all on function pgfence_pgflow.sync_workers(), pgfence_pgflow.ensure_workers(),
                       pgfence_pgflow.requeue_stalled_tasks(), pgfence_pgflow.prune_workers(interval)
  from public;
grant execute on function pgfence_pgflow.sync_workers(), pgfence_pgflow.ensure_workers(),
                         pgfence_pgflow.requeue_stalled_tasks(), pgfence_pgflow.prune_workers(interval)
   to pgfence_operator;

commit;

-- Deploy pgfence_pgflow:pgflow_workers
-- requires: pgflow_start_tasks
-- requires: pgflow_lockdown
-- requires: pgflow_prune_health
--
-- pgflow's own worker registration as pgfence's (pgflow 0.9 and later: worker_functions,
-- ensure_workers, workers.stopped_at; on 0.8 only what it has): worker_functions follow
-- pgfence's resources, workers are started through the startup handshake, the workers of an
-- ended lease are marked so, and pgflow's maintenance runs under `enforce`.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- worker_functions.enabled follows pgfence's resources.enabled: a function that is a pgfence
-- resource is pinged exactly while its resource is enabled, so an update window (which
-- disables the resource, then restores exactly what it saved) disables and restores it
-- exactly, and nobody enables it past pgfence (I6). One trigger on each side: a resource
-- changed, and a row pgflow writes (track_worker_function on a worker's start, or by hand).
create function pgfence_pgflow.follow_resource()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if tg_table_schema = 'pgflow' then
    new.enabled := coalesce((select r.enabled from pgfence.resources r where r.resource = new.function_name),
                            new.enabled);
    return new;
  end if;
  -- pgfence.resources changed: pgflow 0.8 has no worker_functions.
  if pg_catalog.to_regclass('pgflow.worker_functions') is not null then
    execute 'update pgflow.worker_functions wf set enabled = $2
              where wf.function_name = $1 and wf.enabled is distinct from $2'
      using new.resource, new.enabled;
  end if;
  return null;
end
$$;
revoke all on function pgfence_pgflow.follow_resource() from public;

create trigger pgfence_pgflow_worker_functions after insert or update of enabled on pgfence.resources
  for each row execute function pgfence_pgflow.follow_resource();
do $$
begin
  if pg_catalog.to_regclass('pgflow.worker_functions') is not null then
    execute 'create trigger pgfence_follow_resource before insert or update of enabled, function_name
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
create function pgfence_pgflow.sync_workers()
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_rows bigint;
  v_stopped bigint := 0;
begin
  update pgflow.workers w set deprecated_at = clock_timestamp()
    from pgfence_pgflow.worker_leases wl join pgfence.leases l on l.lease_id = wl.lease_id
   where wl.worker_id = w.worker_id and w.deprecated_at is null
     and l.state in ('superseded', 'draining');
  get diagnostics v_rows = row_count;
  if exists (select from pg_catalog.pg_attribute a
              where a.attrelid = 'pgflow.workers'::regclass and a.attname = 'stopped_at' and not a.attisdropped) then
    execute 'update pgflow.workers w set stopped_at = clock_timestamp()
               from pgfence_pgflow.worker_leases wl join pgfence.leases l on l.lease_id = wl.lease_id
              where wl.worker_id = w.worker_id and w.stopped_at is null and l.state = ''released''';
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
-- pgflow's debounce still applies; its URL and credentials are pgflow's (Vault's
-- supabase_project_id, pgflow_auth_secret or supabase_service_role_key; kong locally).
-- A function that is not a pgfence resource is left to pgflow's own ensure_workers. The
-- cron job pgflow schedules is pointed here by pgfence_pgflow.setup_cron().
create function pgfence_pgflow.ensure_workers()
returns table (function_name text, invoked boolean, request_id bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
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
    select wf.function_name
      from pgflow.worker_functions wf join pgfence.resources r on r.resource = wf.function_name
     where wf.enabled and r.enabled
       and (v_local or wf.last_invoked_at is null or wf.last_invoked_at < now() - wf.debounce)
     order by wf.function_name
       for update of wf skip locked
  loop
    v_invocation := pgfence.request_start(v_fn.function_name);
    continue when v_invocation is null;
    function_name := v_fn.function_name;
    invoked := true;
    request_id := net.http_post(
      url => v_base || '/' || v_fn.function_name,
      headers => case when v_local then '{}'::jsonb
                      else jsonb_build_object('Content-Type', 'application/json', 'Authorization', 'Bearer ' || v_key) end,
      body => jsonb_build_object('invocation_id', v_invocation));
    update pgflow.worker_functions wf set last_invoked_at = clock_timestamp()
     where wf.function_name = v_fn.function_name;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.ensure_workers() is
  'pgflow''s ensure_workers through the startup handshake: pings a worker function that is a pgfence resource only when '
  'pgfence.request_start returns an invocation id, and sends it ({"invocation_id": ...}). pgflow 0.9+.';

-- pgflow's maintenance under `enforce`: its functions write step_tasks and the queue tables
-- (requeue_stalled_tasks puts tasks back; deleting a worker row sets step_tasks.last_worker_id
-- to NULL), which the guards of a protected table refuse without a fence. These run them
-- with the transaction shown as fenced for the resources of the guards, for this call alone.
create function pgfence_pgflow.as_maintenance(fn text, arg interval default null)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_was text := coalesce(current_setting('pgfence.fenced', true), '');
  v_rows bigint;
begin
  perform pgfence.mark_fenced(r.resource, k.hmac_key)
     from (select distinct unnest(p.resources) as resource from pgfence.protections p
            where (p.tbl::text like 'pgmq.q\_%' or p.tbl = 'pgflow.step_tasks'::regclass)) r,
          pgfence.signing_key k;
  if fn = 'requeue' then
    -- pgflow before 0.13 (0.8.1) has no requeue_stalled_tasks: nothing requeues there but
    -- the layer's takeover, once a stalled task's message comes back.
    v_rows := 0;
    if pg_catalog.to_regprocedure('pgflow.requeue_stalled_tasks()') is not null then
      execute 'select pgflow.requeue_stalled_tasks()' into v_rows;
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
       and not exists (select from pgfence_pgflow.worker_leases wl join pgfence.leases l on l.lease_id = wl.lease_id
                        where wl.worker_id = w.worker_id
                          and l.state in ('active', 'draining') and l.expires_at > clock_timestamp());
    get diagnostics v_rows = row_count;
    delete from pgfence_pgflow.worker_leases wl
     where not exists (select from pgflow.workers w where w.worker_id = wl.worker_id);
  end if;
  perform set_config('pgfence.fenced', v_was, true);
  return v_rows;
end
$$;
revoke all on function pgfence_pgflow.as_maintenance(text, interval) from public;

create function pgfence_pgflow.requeue_stalled_tasks()
returns integer
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select pgfence_pgflow.as_maintenance('requeue')::int;
$$;
comment on function pgfence_pgflow.requeue_stalled_tasks() is
  'pgflow''s requeue_stalled_tasks (0.13+; 0 on an older pgflow, which has none), also where step_tasks and the queues '
  'are protected in enforce mode. A task it puts back is started again by the next read: the stalled attempt''s result '
  'is stale.';

create function pgfence_pgflow.prune_workers(older_than interval default '7 days')
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

-- pgflow's cron jobs, pointed at the layer: ensure_workers through the handshake, and
-- requeue_stalled_tasks under enforce (pg_cron's cron.alter_job keeps the schedule).
create function pgfence_pgflow.setup_cron()
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_n int := 0;
begin
  if pg_catalog.to_regnamespace('cron') is null then
    return 'pg_cron is not installed: nothing to do';
  end if;
  execute 'select count(cron.alter_job(j.jobid, command => c.command))
             from cron.job j join (values (''pgflow_ensure_workers'', ''select pgfence_pgflow.ensure_workers()''),
                                          (''pgflow_requeue_stalled_tasks'', ''select pgfence_pgflow.requeue_stalled_tasks()''))
                                  c(jobname, command) on c.jobname = j.jobname'
    into v_n;
  return format('%s pgflow cron jobs now call pgfence_pgflow', v_n);
end
$$;
comment on function pgfence_pgflow.setup_cron() is
  'Operator, once after installing the layer on pgflow 0.14: pgflow''s cron jobs pgflow_ensure_workers and '
  'pgflow_requeue_stalled_tasks call pgfence_pgflow.ensure_workers() and requeue_stalled_tasks() instead.';

revoke all on function pgfence_pgflow.sync_workers(), pgfence_pgflow.ensure_workers(),
                       pgfence_pgflow.requeue_stalled_tasks(), pgfence_pgflow.prune_workers(interval),
                       pgfence_pgflow.setup_cron()
  from public;
grant execute on function pgfence_pgflow.sync_workers(), pgfence_pgflow.ensure_workers(),
                         pgfence_pgflow.requeue_stalled_tasks(), pgfence_pgflow.prune_workers(interval),
                         pgfence_pgflow.setup_cron()
   to pgfence_operator;

do $$ begin perform pgfence.lockdown('pgfence_pgflow'); end $$;

commit;

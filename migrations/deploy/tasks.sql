-- Deploy pgfence:tasks
-- requires: fence

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create table pgfence.tasks (
  task_id       bigint generated always as identity primary key,
  queue         text not null,
  payload       jsonb not null,
  state         text not null check (state in ('queued', 'claimed', 'completed', 'failed')),
  max_attempts  int not null,
  attempt       int not null default 0,        -- claims so far; the latest is the current attempt
  lease_id      uuid,                          -- the lease the latest claim was made under
  reported      boolean not null default false, -- the latest attempt has sent its result
  ready_at      timestamptz not null,          -- queued: claimable from
  visible_until timestamptz,                   -- claimed: the attempt holds it until
  result        jsonb,
  error         jsonb,
  enqueued_at   timestamptz not null default clock_timestamp(),
  finished_at   timestamptz
);
comment on table pgfence.tasks is 'The task queue. Not a public interface: use enqueue, claim, complete, fail, extend.';
create index tasks_ready on pgfence.tasks (queue, ready_at) where state = 'queued';
-- Also the list of claimed tasks the views and update_status count per lease: an index on
-- lease_id would be one more entry to write per claimed task, on the hottest path.
create index tasks_visibility on pgfence.tasks (visible_until) where state = 'claimed';

-- Results that arrived from an attempt that no longer holds its task (I5): kept for operators,
-- never applied, never silently dropped.
create table pgfence.stale_results (
  attempt_id  uuid primary key,
  task_id     bigint not null,
  attempt     int not null,
  kind        text not null check (kind in ('complete', 'fail')),
  body        jsonb,
  received_at timestamptz not null default clock_timestamp()
);
comment on table pgfence.stale_results is 'Results refused as stale: the attempt had been superseded by a newer claim.';

-- An attempt_id is a version-8 UUID (RFC 9562) that names its task and attempt and is signed
-- over them and the lease that claimed it:
--   task_id (48 bits) | version 8 | attempt (12 bits) | variant | signature (60 bits)
-- so a result finds its task by primary key, and the current attempt's id is checked exactly.
-- The lease is signed in because task ids and attempt numbers can be issued again after an
-- asynchronous failover lost a claim; lease ids never are (I3).
-- An expression its callers inline (see pgfence.sign, also for why every name in it is
-- qualified): claim signs every id it mints with one read of the key.
create function pgfence.attempt_uuid(task_id bigint, attempt int, lease_id uuid, key bytea)
returns uuid
language sql
stable
as $$
  select pg_catalog.format('%s8%s8%s',
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.task_id), 12, '0'),
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.attempt), 3, '0'),
           pg_catalog.left(pgfence.sign(pg_catalog.format('attempt %s %s %s', attempt_uuid.task_id,
                                                          attempt_uuid.attempt, attempt_uuid.lease_id),
                                        attempt_uuid.key), 15))::pg_catalog.uuid;
$$;

-- The same, reading the key itself: for checking one id.
create function pgfence.attempt_uuid(task_id bigint, attempt int, lease_id uuid)
returns uuid
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt_id uuid;
begin
  select pgfence.attempt_uuid(attempt_uuid.task_id, attempt_uuid.attempt, attempt_uuid.lease_id, k.key)
    into v_attempt_id
    from pgfence.signing_key k;
  return v_attempt_id;
end
$$;

-- The task id an attempt_id names (NULL for NULL), unchecked: an expression its callers inline
-- (see pgfence.sign) to find the task by primary key before they check the whole id.
create function pgfence.attempt_task(attempt_id uuid)
returns bigint
language sql
immutable
as $$
  select pg_catalog.textcat('x0000', pg_catalog.left(pg_catalog.replace(attempt_task.attempt_id::pg_catalog.text, '-', ''), 12))
           ::pg_catalog.bit(64)::pg_catalog.int8;
$$;

-- The task and attempt number an attempt_id names; 22023 for NULL or an id of another shape.
-- The signature is checked by the caller, against the lease that holds the task.
create function pgfence.attempt_of(attempt_id uuid, out task_id bigint, out attempt int)
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_hex text := replace(attempt_of.attempt_id::text, '-', '');
begin
  if v_hex is not null and substr(v_hex, 13, 1) = '8' and substr(v_hex, 17, 1) = '8' then
    task_id := ('x' || lpad(substr(v_hex, 1, 12), 16, '0'))::bit(64)::bigint;
    attempt := ('x' || lpad(substr(v_hex, 14, 3), 8, '0'))::bit(32)::int;
    if attempt >= 1 then
      return;
    end if;
  end if;
  perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.claim',
                                   attempt_of.attempt_id::text);
end
$$;

create function pgfence.unknown_attempt(attempt_id uuid)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.invalid_argument('attempt_id', 'no such attempt', attempt_id::text);
end
$$;

create function pgfence.enqueue(queue text, payload jsonb default '{}', max_attempts int default 3)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_task_id bigint;
begin
  perform pgfence.check_name('queue', enqueue.queue);
  perform pgfence.check_not_null('payload', enqueue.payload);
  if enqueue.max_attempts is null or enqueue.max_attempts not between 1 and 1000 then
    perform pgfence.invalid_argument('max_attempts', 'must be 1 to 1000', enqueue.max_attempts::text);
  end if;
  insert into pgfence.tasks as t (queue, payload, state, max_attempts, ready_at)
  values (enqueue.queue, enqueue.payload, 'queued', enqueue.max_attempts, clock_timestamp())
  returning t.task_id into v_task_id;
  return v_task_id;
end
$$;
comment on function pgfence.enqueue(text, jsonb, int) is
  'Adds a task to queue; returns its task_id. Raises 22023 on a bad queue name, NULL payload or max_attempts outside 1..1000.';

create function pgfence.claim(lease_id uuid, queue text, qty int default 1, visibility interval default '30 seconds')
returns table (task_id bigint, attempt_id uuid, attempt int, payload jsonb)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- The claim below has one good plan whatever the queue's size or qty (a primary-key lookup of
-- the picked ids); costed with qty unknown, plpgsql would plan it again on every call.
set plan_cache_mode = force_generic_plan
as $$
declare
  v_state text;
  v_expires_at timestamptz;
  v_key bytea;
begin
  perform pgfence.check_not_null('lease_id', claim.lease_id);
  perform pgfence.check_name('queue', claim.queue);
  if claim.qty is null or claim.qty not between 1 and 1000 then
    perform pgfence.invalid_argument('qty', 'must be 1 to 1000', claim.qty::text);
  end if;
  perform pgfence.check_interval('visibility', claim.visibility);
  -- The ownership check of fence(), in the same transaction as the claim: FOR KEY SHARE keeps
  -- the lease current until this transaction ends, so no successor can be granted between
  -- the check and the claim (I2 at the work boundary).
  select l.state, l.expires_at into v_state, v_expires_at
    from pgfence.leases l
   where l.lease_id = claim.lease_id
     for key share;
  if not found or v_state <> 'active' or v_expires_at <= clock_timestamp() then
    perform pgfence.lease_not_current(claim.lease_id);
  end if;
  select k.key into v_key from pgfence.signing_key k;
  -- SKIP LOCKED: claimers never wait for each other's rows. The ids are picked into an array
  -- so that the update finds its rows by primary key.
  return query
  update pgfence.tasks t
     set state = 'claimed',
         attempt = t.attempt + 1,
         lease_id = claim.lease_id,
         reported = false,
         visible_until = clock_timestamp() + claim.visibility
   where t.task_id = any (array(
           select p.task_id
             from pgfence.tasks p
            where p.queue = claim.queue and p.state = 'queued' and p.ready_at <= clock_timestamp()
            order by p.ready_at
            limit claim.qty
              for update skip locked))
  returning t.task_id, pgfence.attempt_uuid(t.task_id, t.attempt, claim.lease_id, v_key), t.attempt, t.payload;
end
$$;
comment on function pgfence.claim(uuid, text, int, interval) is
  'Claims up to qty ready tasks of queue under an active, unexpired lease, never waiting for rows other claimers hold; '
  'each claim mints an attempt_id. Raises PF001 when the lease is not current, 22023 on bad arguments.';

-- complete and fail share one rule (I5): the result of the attempt that holds the task is
-- accepted, even after its lease expired or drained, as long as no newer attempt claimed it.
create function pgfence.report(attempt_id uuid, kind text, body jsonb)
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_task_id bigint;
  v_attempt int;
  v_task pgfence.tasks;
  v_final boolean;
begin
  select a.task_id, a.attempt into v_task_id, v_attempt from pgfence.attempt_of(report.attempt_id) a;
  select * into v_task from pgfence.tasks t where t.task_id = v_task_id for update;
  if not found or v_attempt > v_task.attempt
     or (v_attempt = v_task.attempt
         and pgfence.attempt_uuid(v_task_id, v_attempt, v_task.lease_id) <> report.attempt_id) then
    perform pgfence.unknown_attempt(report.attempt_id);
  end if;
  -- An older attempt's lease is not kept, so its signature cannot be checked: it can change
  -- nothing but a row in stale_results.
  if v_attempt < v_task.attempt then
    insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body)
    values (report.attempt_id, v_task_id, v_attempt, report.kind, report.body)
    on conflict on constraint stale_results_pkey do nothing;
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

create function pgfence.complete(attempt_id uuid, result jsonb default null)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  -- The common case in one statement: the attempt that holds the task completes it, once (the
  -- id is the current attempt's only if its signature matches the row's attempt and lease).
  -- No clock in the condition, so a lock wait cannot make it wrong: a concurrent update of the
  -- row is re-checked (EvalPlanQual), and a transaction that only locked it changed nothing.
  update pgfence.tasks t
     set state = 'completed', result = complete.result, reported = true,
         visible_until = null, finished_at = clock_timestamp()
    from pgfence.signing_key k
   where t.task_id = pgfence.attempt_task(complete.attempt_id) and not t.reported
     and pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id, k.key) = complete.attempt_id;
  if found then
    return 'accepted';
  end if;
  -- Everything else (a retry, a stale or unknown attempt, a bad id) by the rule of report.
  return pgfence.report(complete.attempt_id, 'complete', complete.result);
end
$$;
comment on function pgfence.complete(uuid, jsonb) is
  'Finishes a task with result: accepted from the attempt that holds it (also after its lease expired), '
  'duplicate for a retry of a reported attempt, stale (recorded in pgfence.stale_results) from a superseded attempt. Raises 22023 for an unknown attempt.';

create function pgfence.fail(attempt_id uuid, error jsonb default null)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  return pgfence.report(fail.attempt_id, 'fail', fail.error);
end
$$;
comment on function pgfence.fail(uuid, jsonb) is
  'Reports a failed attempt: the task is retried with backoff, or fails for good after max_attempts. '
  'Same acceptance rule and outcomes as complete.';

create function pgfence.extend(attempt_id uuid, visibility interval)
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

create function pgfence.requeue_expired(max_tasks int default 1000)
returns int
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_count int;
begin
  if requeue_expired.max_tasks is null or requeue_expired.max_tasks not between 1 and 100000 then
    perform pgfence.invalid_argument('max_tasks', 'must be 1 to 100000', requeue_expired.max_tasks::text);
  end if;
  -- SKIP LOCKED lets several sessions run this at once. A row whose visibility was extended
  -- after this statement's snapshot is re-read under the lock and no longer matches.
  with expired as (
    select t.task_id
      from pgfence.tasks t
     where t.state = 'claimed' and t.visible_until < clock_timestamp()
     order by t.visible_until
     limit requeue_expired.max_tasks
       for update skip locked)
  update pgfence.tasks t
     set state = case when t.attempt >= t.max_attempts then 'failed' else 'queued' end,
         ready_at = clock_timestamp(),
         visible_until = null,
         error = case when t.attempt >= t.max_attempts
                      then jsonb_build_object('reason', 'visibility expired', 'attempts', t.attempt)
                      else t.error end,
         finished_at = case when t.attempt >= t.max_attempts then clock_timestamp() end
    from expired
   where t.task_id = expired.task_id;
  get diagnostics v_count = row_count;
  return v_count;
end
$$;
comment on function pgfence.requeue_expired(int) is
  'Tasks whose visibility ran out go back to their queue, or fail for good after max_attempts; returns how many. '
  'Safe to run from several sessions at once; never touches an attempt within its visibility.';

revoke all on table pgfence.tasks, pgfence.stale_results from public;
revoke all on function pgfence.attempt_uuid(bigint, int, uuid, bytea), pgfence.attempt_uuid(bigint, int, uuid),
                       pgfence.attempt_task(uuid),
                       pgfence.attempt_of(uuid), pgfence.unknown_attempt(uuid),
                       pgfence.report(uuid, text, jsonb), pgfence.enqueue(text, jsonb, int),
                       pgfence.claim(uuid, text, int, interval), pgfence.complete(uuid, jsonb),
                       pgfence.fail(uuid, jsonb), pgfence.extend(uuid, interval), pgfence.requeue_expired(int)
  from public;
grant execute on function pgfence.enqueue(text, jsonb, int), pgfence.claim(uuid, text, int, interval),
                          pgfence.complete(uuid, jsonb), pgfence.fail(uuid, jsonb),
                          pgfence.extend(uuid, interval), pgfence.requeue_expired(int)
   to pgfence_worker;
grant execute on function pgfence.enqueue(text, jsonb, int), pgfence.requeue_expired(int) to pgfence_operator;
grant select on table pgfence.stale_results to pgfence_monitor, pgfence_operator;

commit;

-- Schema pgfence_test: helpers for the test suites, installed into test databases only and
-- never deployed. Time passing is simulated here by moving expiry into the past: production
-- code has no clock override.
create schema if not exists pgfence_test;

-- Forget everything pgfence holds (inside a pgTAP transaction that rolls back anyway), but
-- the signing key: without it no fence or attempt id could be recognised.
create or replace function pgfence_test.reset()
returns void
language plpgsql
as $$
declare
  v_tables text;
begin
  select string_agg(format('%I.%I', schemaname, tablename), ', ')
    into v_tables
    from pg_catalog.pg_tables
   where schemaname = 'pgfence' and tablename <> 'signing_key';
  execute 'truncate ' || v_tables || ' restart identity cascade';
end
$$;

-- The lease's time is up, as if its owner paused longer than its ttl.
create or replace function pgfence_test.expire(lease_id uuid)
returns void
language sql
as $$
  update pgfence.leases l
     set expires_at = clock_timestamp() - interval '1 millisecond'
   where l.lease_id = expire.lease_id;
$$;

-- Registers the resource if needed and returns a new current lease's id.
create or replace function pgfence_test.lease(resource text, owner text default 'test-owner',
                                              ttl interval default '30 seconds')
returns uuid
language plpgsql
as $$
declare
  v_lease pgfence.lease;
begin
  perform pgfence.register(lease.resource);
  v_lease := pgfence.acquire(lease.resource, lease.owner, lease.ttl);
  if v_lease.lease_id is null then
    raise exception 'pgfence_test.lease: % is held by a current lease', lease.resource;
  end if;
  return v_lease.lease_id;
end
$$;

-- A lease that expired and was superseded by a successor (owner 'successor'); returns the
-- old lease's id.
create or replace function pgfence_test.superseded_lease(resource text)
returns uuid
language plpgsql
as $$
declare
  v_old uuid;
begin
  v_old := pgfence_test.lease(superseded_lease.resource, 'predecessor');
  perform pgfence_test.expire(v_old);
  perform pgfence_test.lease(superseded_lease.resource, 'successor');
  return v_old;
end
$$;

-- The lease currently active for a resource (for tests that need the successor's id).
create or replace function pgfence_test.active_lease(resource text)
returns uuid
language sql
as $$
  select l.lease_id from pgfence.leases l where l.resource = active_lease.resource and l.state = 'active';
$$;

-- The attempt's visibility ran out, as if its handler hung or its worker died.
create or replace function pgfence_test.expire_attempt(attempt_id uuid)
returns void
language sql
as $$
  update pgfence.tasks t
     set visible_until = clock_timestamp() - interval '1 millisecond'
    from pgfence.attempt_of(expire_attempt.attempt_id) a
   where t.task_id = a.task_id and t.attempt = a.attempt;
$$;

-- A startup request nobody acknowledged in time.
create or replace function pgfence_test.expire_invocation(invocation_id uuid)
returns void
language sql
as $$
  update pgfence.invocations i
     set expires_at = clock_timestamp() - interval '1 millisecond'
   where i.invocation_id = expire_invocation.invocation_id;
$$;

-- Failed tasks wait out their backoff: make every queued task ready now.
create or replace function pgfence_test.skip_backoff()
returns void
language sql
as $$
  update pgfence.tasks t set ready_at = clock_timestamp() where t.state = 'queued';
$$;

-- An attempt id of the right shape whose signature is wrong: what a forger could make up.
create or replace function pgfence_test.forged_attempt(task_id bigint, attempt int)
returns uuid
language sql
as $$
  select overlay(a::text placing case when right(a::text, 1) = '0' then '1' else '0' end from 36 for 1)::uuid
    from pgfence.attempt_uuid(forged_attempt.task_id, forged_attempt.attempt,
                              coalesce((select t.lease_id from pgfence.tasks t where t.task_id = forged_attempt.task_id),
                                       gen_random_uuid())) a;
$$;

-- A pgmq message's visibility timeout ran out, as if its reader paused longer than vt. Past
-- the guard of a protected queue table (replica mode skips triggers for this one statement).
create or replace function pgfence_test.expire_message(queue text, msg_id bigint)
returns void
language plpgsql
as $$
declare
  v_role text := current_setting('session_replication_role');
begin
  perform set_config('session_replication_role', 'replica', true);
  execute format('update pgmq.%I set vt = clock_timestamp() - interval ''1 millisecond'' where msg_id = $1',
                 'q_' || lower(queue))
    using msg_id;
  perform set_config('session_replication_role', v_role, true);
end
$$;

-- A started pgflow task's time is up, as if its handler ran longer than its step's timeout + 2 s
-- (coalesce(the step's, the flow's), as the start uses): its start moved back that far, and
-- its message (of the flow's queue) visible again. Past the guards of protected tables.
create or replace function pgfence_test.stall_task(flow_slug text, msg_id bigint)
returns void
language plpgsql
as $$
declare
  v_role text := current_setting('session_replication_role');
begin
  perform set_config('session_replication_role', 'replica', true);
  update pgflow.step_tasks st
     set started_at = st.started_at - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 3),
         queued_at = st.queued_at - make_interval(secs => coalesce(s.opt_timeout, f.opt_timeout) + 3)
    from pgflow.steps s join pgflow.flows f on f.flow_slug = s.flow_slug
   where s.flow_slug = st.flow_slug and s.step_slug = st.step_slug
     and st.flow_slug = stall_task.flow_slug and st.message_id = stall_task.msg_id and st.status = 'started';
  perform pgfence_test.expire_message(stall_task.flow_slug, stall_task.msg_id);
  perform set_config('session_replication_role', v_role, true);
end
$$;

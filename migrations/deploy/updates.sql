-- Deploy pgfence:updates
-- requires: tasks
-- requires: request_start
--
-- Operator windows for deploying new worker code: prepare_update -> update_status ->
-- finish_update. The state lives here, not in a client: a window survives sessions, CLI
-- restarts and crashes, and never expires or resumes by itself.
--
-- Lock order, shared with acquire, request_start, set_enabled and deprecate: the update row
-- (finish only), then resource rows in name order, then lease rows. Two operators, or an
-- operator and starting workers, therefore wait for each other and never deadlock.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create table pgfence.updates (
  token       uuid primary key,
  request_id  uuid not null unique,
  resources   text[] not null,               -- sorted, distinct: the set the request named
  prepared_at timestamptz not null default clock_timestamp(),
  finished_at timestamptz
);
comment on table pgfence.updates is 'Update windows. Not a public interface: use the functions and pgfence.open_updates.';

create table pgfence.update_items (
  token               uuid not null references pgfence.updates,
  resource            text not null references pgfence.resources,
  saved_enabled       boolean not null,       -- exactly what enabled was before the window
  enabled_version     bigint not null,        -- resources.enabled_version once prepare disabled it
  drained_generation  bigint,                 -- the active lease prepare drained, if any
  pending_invocations bigint not null,        -- pending startup requests prepare saw
  outcome             text check (outcome in ('restored', 'kept_disabled', 'conflict')),
  primary key (token, resource)
);
-- A resource belongs to at most one open window.
create unique index update_items_one_open on pgfence.update_items (resource) where outcome is null;

create function pgfence.prepare_update(resources text[], request_id uuid)
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_set text[];
  v_found text[];
  v_missing text[];
  v_existing pgfence.updates;
  v_open text;
  v_token uuid;
  v_resource record;
  v_version bigint;
  v_drained bigint;
begin
  perform pgfence.check_not_null('request_id', prepare_update.request_id);
  if prepare_update.resources is null or cardinality(prepare_update.resources) not between 1 and 1000
     or array_position(prepare_update.resources, null) is not null then
    perform pgfence.invalid_argument('resources', 'must name 1 to 1000 resources, none NULL',
                                     prepare_update.resources::text);
  end if;
  perform pgfence.check_name('resources', r) from unnest(prepare_update.resources) r;
  select array_agg(distinct r order by r) into v_set from unnest(prepare_update.resources) r;
  if cardinality(v_set) <> cardinality(prepare_update.resources) then
    perform pgfence.invalid_argument('resources',
      'names ' || (select string_agg(r, ', ') from (select r from unnest(prepare_update.resources) r
                                                     group by r having count(*) > 1 order by r) d)
               || ' more than once',
      prepare_update.resources::text);
  end if;

  -- Claim the request_id first (the update row comes first in the lock order). A concurrent
  -- prepare with the same request_id waits here until this one commits or rolls back.
  insert into pgfence.updates as u (token, request_id, resources)
  values (gen_random_uuid(), prepare_update.request_id, v_set)
  on conflict on constraint updates_request_id_key do nothing
  returning u.token into v_token;
  if v_token is null then
    -- A retry after a lost response gets the original window back, untouched: saving the
    -- temporary false now would lose the state to restore.
    select * into v_existing from pgfence.updates u where u.request_id = prepare_update.request_id;
    if v_existing.resources <> v_set then
      raise exception 'pgfence: request_id % was used for another set of resources', prepare_update.request_id
        using errcode = 'PF004', detail = format('update %s covers %s', v_existing.token, array_to_string(v_existing.resources, ', ')),
              hint = 'use a new request_id for a new update';
    end if;
    return v_existing.token;
  end if;

  -- Then the resources, in name order, before looking at anything else.
  select array_agg(r.resource order by r.resource) into v_found
    from (select x.resource from pgfence.resources x
           where x.resource = any (v_set) order by x.resource for no key update) r;
  select array_agg(r order by r) into v_missing from unnest(v_set) r where r <> all (coalesce(v_found, '{}'));
  if v_missing is not null then
    raise exception 'pgfence: unknown resources: %', array_to_string(v_missing, ', ')
      using errcode = 'PF002', hint = 'nothing was changed; register them or fix the names';
  end if;

  select string_agg(format('%s (update %s)', i.resource, i.token), ', ' order by i.resource) into v_open
    from pgfence.update_items i
   where i.resource = any (v_set) and i.outcome is null;
  if v_open is not null then
    raise exception 'pgfence: resources already in an open update: %', v_open
      using errcode = 'PF004', hint = 'finish that update first: pgfence.finish_update(token)';
  end if;

  for v_resource in
    select r.resource, r.enabled from pgfence.resources r where r.resource = any (v_set) order by r.resource
  loop
    update pgfence.resources r
       set enabled = false, enabled_version = r.enabled_version + 1
     where r.resource = v_resource.resource
    returning r.enabled_version into v_version;
    -- The active lease stops claiming; FOR UPDATE waits for its open fenced transactions.
    select l.generation into v_drained
      from pgfence.leases l
     where l.resource = v_resource.resource and l.state = 'active'
       for update;
    if found then
      update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
       where l.resource = v_resource.resource and l.generation = v_drained;
    end if;
    insert into pgfence.update_items (token, resource, saved_enabled, enabled_version, drained_generation,
                                      pending_invocations)
    values (v_token, v_resource.resource, v_resource.enabled, v_version, v_drained,
            (select count(*) from pgfence.invocations i
              where i.resource = v_resource.resource and i.acknowledged_at is null
                and i.expires_at > clock_timestamp()));
  end loop;
  return v_token;
end
$$;
comment on function pgfence.prepare_update(text[], uuid) is
  'Operator: opens an update window over resources: saves each one''s exact enabled, disables them, drains their active leases; '
  'returns the token. A retry with the same request_id and set returns the same token and changes nothing. '
  'Raises 22023 (bad set), PF002 (unknown names, listed), PF004 (overlap with an open window, or request_id reused for another set).';

create function pgfence.update_not_found(token uuid)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'pgfence: update % does not exist', token
    using errcode = 'PF005', hint = 'check the token prepare_update returned; open windows are listed in pgfence.open_updates';
end
$$;

create function pgfence.update_status(token uuid)
returns table (resource text, saved_enabled boolean, enabled boolean, active_owner text,
               draining_leases bigint, in_flight_tasks bigint, pending_invocations bigint,
               verdict text, last_heartbeat timestamptz)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_not_null('token', update_status.token);
  if not exists (select from pgfence.updates u where u.token = update_status.token) then
    perform pgfence.update_not_found(update_status.token);
  end if;
  -- Reads only, so it runs in a read-only transaction. drained means observed quiet: no
  -- current lease, no draining lease still renewing, no task held, no start pending. It is
  -- not proof that a runtime terminated. unknown: a draining lease went silent (expired)
  -- while its attempts still hold tasks; nobody can tell whether their handlers stopped.
  return query
  select i.resource,
         i.saved_enabled,
         r.enabled,
         cur.owner,
         d.all_draining,
         t.held,
         p.pending,
         case when i.outcome is not null then 'finished'
              when d.silent_holding > 0 then 'unknown'
              when cur.owner is not null or d.live > 0 or t.held > 0 or p.pending > 0 then 'draining'
              else 'drained' end,
         d.heartbeat
    from pgfence.update_items i
    join pgfence.resources r on r.resource = i.resource
    left join pgfence.leases cur
           on cur.resource = i.resource and cur.state = 'active' and cur.expires_at > clock_timestamp()
    cross join lateral (
      select count(*) as all_draining,
             count(*) filter (where l.expires_at > clock_timestamp()) as live,
             count(*) filter (where l.expires_at <= clock_timestamp()
                                and exists (select from pgfence.tasks x
                                             where x.lease_id = l.lease_id and x.state = 'claimed')) as silent_holding,
             max(coalesce(l.renewed_at, l.acquired_at)) as heartbeat
        from pgfence.leases l
       where l.resource = i.resource and l.state = 'draining') d
    cross join lateral (
      select count(*) as held
        from pgfence.leases l join pgfence.tasks x on x.lease_id = l.lease_id and x.state = 'claimed'
       where l.resource = i.resource) t
    cross join lateral (
      select count(*) as pending
        from pgfence.invocations v
       where v.resource = i.resource and v.acknowledged_at is null and v.expires_at > clock_timestamp()) p
   where i.token = update_status.token
   order by i.resource;
end
$$;
comment on function pgfence.update_status(uuid) is
  'Read-only view of an update window, one row per resource, with the verdict drained (observed quiet, not proof of '
  'termination), draining, unknown (a draining lease went silent holding tasks) or finished. Raises PF005.';

create function pgfence.finish_update(token uuid)
returns table (resource text, enabled boolean, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_item record;
  v_outcome text;
begin
  perform pgfence.check_not_null('token', finish_update.token);
  -- The update row first, then the resource rows in name order (the shared lock order).
  perform from pgfence.updates u where u.token = finish_update.token for update;
  if not found then
    perform pgfence.update_not_found(finish_update.token);
  end if;
  perform from pgfence.resources r
   where r.resource in (select i.resource from pgfence.update_items i where i.token = finish_update.token)
   order by r.resource
     for no key update;

  for v_item in
    select i.resource, i.saved_enabled, i.enabled_version, i.outcome, r.enabled_version as current_version
      from pgfence.update_items i join pgfence.resources r on r.resource = i.resource
     where i.token = finish_update.token
     order by i.resource
  loop
    if v_item.outcome is not null then
      v_outcome := 'already_finished';
    elsif v_item.current_version <> v_item.enabled_version then
      -- Someone set enabled inside the window: theirs is the newer decision. Leave it.
      v_outcome := 'conflict';
    elsif v_item.saved_enabled then
      update pgfence.resources r
         set enabled = true, enabled_version = r.enabled_version + 1
       where r.resource = v_item.resource;
      v_outcome := 'restored';
    else
      -- It was disabled before the window: it stays disabled (I6).
      v_outcome := 'kept_disabled';
    end if;
    if v_outcome <> 'already_finished' then
      update pgfence.update_items i set outcome = v_outcome
       where i.token = finish_update.token and i.resource = v_item.resource;
    end if;
    resource := v_item.resource;
    enabled := (select r.enabled from pgfence.resources r where r.resource = v_item.resource);
    outcome := v_outcome;
    return next;
  end loop;
  update pgfence.updates u set finished_at = clock_timestamp()
   where u.token = finish_update.token and u.finished_at is null;
end
$$;
comment on function pgfence.finish_update(uuid) is
  'Operator: closes an update window, restoring exactly the saved enabled values: restored, kept_disabled, conflict '
  '(enabled was changed inside the window: left as it is) or already_finished (idempotent). Raises PF005.';

create view pgfence.open_updates as
select u.token, u.resources, u.prepared_at
  from pgfence.updates u
 where u.finished_at is null;
comment on view pgfence.open_updates is 'Update windows not yet finished. They never expire or finish by themselves.';

revoke all on table pgfence.updates, pgfence.update_items from public;
revoke all on pgfence.open_updates from public;
revoke all on function pgfence.prepare_update(text[], uuid), pgfence.update_not_found(uuid),
                       pgfence.update_status(uuid), pgfence.finish_update(uuid)
  from public;
grant execute on function pgfence.prepare_update(text[], uuid), pgfence.finish_update(uuid) to pgfence_operator;
grant execute on function pgfence.update_status(uuid) to pgfence_operator, pgfence_monitor;
grant select on pgfence.open_updates to pgfence_operator, pgfence_monitor;

commit;

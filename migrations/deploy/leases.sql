-- Deploy pgfence:leases
-- requires: resources
--
-- Lock discipline (one row per lease, I1/I2/I7):
--   fence        FOR KEY SHARE on the lease row      held to the end of the fenced transaction
--   renew        FOR NO KEY UPDATE (plain UPDATE)    does not wait for fenced transactions
--   takeover, drain, release, deprecate
--                FOR UPDATE on the lease row         waits for every open fenced transaction
-- FOR UPDATE is the only one of these that conflicts with FOR KEY SHARE, so a lease cannot
-- stop being current while a transaction that fenced it is open, yet its owner can keep
-- renewing during a long fenced transaction. Acquirers, request_start and update windows
-- serialize on the resource row (FOR NO KEY UPDATE), always taken before any lease row.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One sequence for all resources: generations strictly increase per resource (takeovers of a
-- resource serialize on its row), and never repeat, even if a resource is dropped and
-- registered again.
create sequence pgfence.generation as bigint;

create type pgfence.lease as (
  lease_id   uuid,
  resource   text,
  generation bigint,
  expires_at timestamptz
);
comment on type pgfence.lease is 'A lease as acquire returns it: present lease_id, stamp generation, mind expires_at.';

create table pgfence.leases (
  lease_id      uuid primary key,
  resource      text not null references pgfence.resources,
  generation    bigint not null unique,
  owner         text not null,
  state         text not null check (state in ('active', 'draining', 'released', 'superseded')),
  acquired_at   timestamptz not null,
  renewed_at    timestamptz,
  expires_at    timestamptz not null,
  renewed_from  timestamptz,                   -- the expiry the latest renewal replaced (see renew)
  drained_at    timestamptz,                   -- when it stopped claiming (drain, deprecate, update window)
  ended_at      timestamptz,
  invocation_id uuid
) with (fillfactor = 70);  -- room on the page keeps renewals HOT
comment on table pgfence.leases is 'Every lease ever granted. Not a public interface: use the functions and lease_status.';
-- I1 as a constraint, behind the locking protocol: never two active leases for one resource.
create unique index leases_one_active on pgfence.leases (resource) where state = 'active';
create index leases_draining on pgfence.leases (resource) where state = 'draining';

create table pgfence.invocations (
  invocation_id   uuid primary key,
  resource        text not null references pgfence.resources,
  requested_at    timestamptz not null,
  expires_at      timestamptz not null,
  acknowledged_at timestamptz,
  lease_id        uuid
);
comment on table pgfence.invocations is 'Startup requests (request_start) and their acknowledgement by acquire.';
create index invocations_pending on pgfence.invocations (resource) where acknowledged_at is null;

-- Raises PF001 with the reason a lease authorizes nothing. Callers hold no lock they need
-- after this: the exception rolls the statement back.
-- expired_at: the expiry the caller found passed, when its own uncommitted write hides it.
create function pgfence.lease_not_current(lease_id uuid, expired_at timestamptz default null)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_reason text;
begin
  select case when lease_not_current.expired_at is not null
              then 'expired at ' || lease_not_current.expired_at
              when l.state in ('active', 'draining') and l.expires_at <= clock_timestamp()
              then 'expired at ' || l.expires_at
              else l.state end
    into v_reason
    from pgfence.leases l
   where l.lease_id = lease_not_current.lease_id;
  raise exception 'pgfence: lease % is not current (%)', lease_not_current.lease_id, coalesce(v_reason, 'unknown')
    using errcode = 'PF001',
          hint = 'stop working under this lease; acquire a new one before claiming or writing';
end
$$;

create function pgfence.resource_not_found(resource text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'pgfence: resource % is not registered', resource
    using errcode = 'PF002', hint = 'register it first with pgfence.register(resource)';
end
$$;

create function pgfence.acquire(resource text, owner text, ttl interval, invocation_id uuid default null)
returns pgfence.lease
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_enabled boolean;
  v_current pgfence.leases;
  v_lease pgfence.lease;
begin
  perform pgfence.check_name('resource', acquire.resource);
  perform pgfence.check_label('owner', acquire.owner);
  perform pgfence.check_interval('ttl', acquire.ttl);

  select r.enabled into v_enabled
    from pgfence.resources r
   where r.resource = acquire.resource
     for no key update;
  if not found then
    perform pgfence.resource_not_found(acquire.resource);
  end if;
  if not v_enabled then
    raise exception 'pgfence: resource % is disabled', acquire.resource
      using errcode = 'PF003', hint = 'a worker started for a disabled resource should exit';
  end if;

  if acquire.invocation_id is not null then
    perform from pgfence.invocations i
     where i.invocation_id = acquire.invocation_id and i.resource = acquire.resource
       for update;
    if not found then
      perform pgfence.invalid_argument('invocation_id', 'no such invocation for this resource',
                                       acquire.invocation_id::text);
    end if;
    -- Acknowledged whatever the outcome: the requested start happened. It grants nothing.
    update pgfence.invocations i
       set acknowledged_at = clock_timestamp()
     where i.invocation_id = acquire.invocation_id and i.acknowledged_at is null;
  end if;

  -- Fast path without the lease row lock: a standby polling a held resource must not queue
  -- behind the owner's fenced transactions. Returning NULL is always safe.
  if exists (select from pgfence.leases l
              where l.resource = acquire.resource and l.state = 'active'
                and l.expires_at > clock_timestamp()) then
    return null;
  end if;

  select * into v_current
    from pgfence.leases l
   where l.resource = acquire.resource and l.state = 'active'
     for update;
  -- Judged after the lock wait on the clock of this moment, never now(): the wait may have
  -- been long and the owner may have renewed meanwhile (I7).
  if found then
    if v_current.expires_at > clock_timestamp() then
      return null;
    end if;
    update pgfence.leases l
       set state = 'superseded', ended_at = clock_timestamp()
     where l.lease_id = v_current.lease_id;
  end if;

  insert into pgfence.leases as l (lease_id, resource, generation, owner, state, acquired_at, expires_at, invocation_id)
  values (gen_random_uuid(), acquire.resource, nextval('pgfence.generation'), acquire.owner, 'active',
          clock_timestamp(), clock_timestamp() + acquire.ttl, acquire.invocation_id)
  returning l.lease_id, l.resource, l.generation, l.expires_at
       into v_lease;

  if acquire.invocation_id is not null then
    update pgfence.invocations i set lease_id = v_lease.lease_id
     where i.invocation_id = acquire.invocation_id;
  end if;
  return v_lease;
end
$$;
comment on function pgfence.acquire(text, text, interval, uuid) is
  'Grants the next generation of a resource when no active unexpired lease exists (a stale one is superseded); '
  'returns NULL while another lease is current. Raises PF002 (unknown), PF003 (disabled), 22023.';

create function pgfence.renew(lease_id uuid, ttl interval, out expires_at timestamptz, out state text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_replaced timestamptz;
  v_updated_at timestamptz;
begin
  perform pgfence.check_not_null('lease_id', renew.lease_id);
  perform pgfence.check_interval('ttl', renew.ttl);
  -- One HOT update. Its lock (FOR NO KEY UPDATE) does not wait for the owner's fenced
  -- transactions (FOR KEY SHARE). Expiry is final: an expired lease never comes back, so a
  -- takeover that found it expired cannot be undone by a late renewal. The WHERE clause is
  -- evaluated before a lock wait, and again after it only if the row was updated meanwhile:
  -- behind a transaction that only locked the row (a repeated drain, an acquire that found
  -- the lease current) the update goes through unchecked, however long it waited. So the
  -- expiry it replaced is kept in renewed_from and judged against the clock read in
  -- RETURNING, which runs after the row is written, after any wait.
  update pgfence.leases l
     set renewed_from = l.expires_at,
         expires_at = clock_timestamp() + renew.ttl,
         renewed_at = clock_timestamp()
   where l.lease_id = renew.lease_id and l.state in ('active', 'draining') and l.expires_at > clock_timestamp()
  returning l.renewed_from, clock_timestamp(), l.expires_at, l.state
       into v_replaced, v_updated_at, expires_at, state;
  if not found then
    perform pgfence.lease_not_current(renew.lease_id);
  elsif v_replaced <= v_updated_at then
    -- It expired while this renewal waited: the exception undoes the update.
    perform pgfence.lease_not_current(renew.lease_id, v_replaced);
  end if;
end
$$;
comment on function pgfence.renew(uuid, interval) is
  'Extends an active or draining, unexpired lease to ttl from now; idempotent. Raises PF001 otherwise.';

create function pgfence.drain(lease_id uuid)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_state text;
  v_expires_at timestamptz;
begin
  perform pgfence.check_not_null('lease_id', drain.lease_id);
  -- FOR UPDATE: the lease stays current until the owner's open fenced transactions end (I2).
  select l.state, l.expires_at into v_state, v_expires_at
    from pgfence.leases l
   where l.lease_id = drain.lease_id
     for update;
  if not found or v_state not in ('active', 'draining') or v_expires_at <= clock_timestamp() then
    perform pgfence.lease_not_current(drain.lease_id);
  end if;
  if v_state = 'active' then
    update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
     where l.lease_id = drain.lease_id;
  end if;
  return 'draining';
end
$$;
comment on function pgfence.drain(uuid) is
  'The owner stops claiming; the resource is free for a successor at once. Idempotent. Raises PF001 for a lease that is not current.';

create function pgfence.release(lease_id uuid)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_state text;
begin
  perform pgfence.check_not_null('lease_id', release.lease_id);
  select l.state into v_state
    from pgfence.leases l
   where l.lease_id = release.lease_id
     for update;
  if not found then
    perform pgfence.lease_not_current(release.lease_id);
  end if;
  if v_state not in ('active', 'draining') then
    return false;
  end if;
  update pgfence.leases l
     set state = 'released', ended_at = clock_timestamp()
   where l.lease_id = release.lease_id;
  return true;
end
$$;
comment on function pgfence.release(uuid) is
  'Ends this lease: true if this call ended it, false if it had already ended. Never touches another lease. Raises PF001 for an unknown lease.';

create function pgfence.deprecate(resource text)
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_lease_id uuid;
begin
  perform pgfence.check_name('resource', deprecate.resource);
  perform from pgfence.resources r where r.resource = deprecate.resource for no key update;
  if not found then
    perform pgfence.resource_not_found(deprecate.resource);
  end if;
  select l.lease_id into v_lease_id
    from pgfence.leases l
   where l.resource = deprecate.resource and l.state = 'active'
     for update;
  if found then
    update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
     where l.lease_id = v_lease_id;
  end if;
  return v_lease_id;
end
$$;
comment on function pgfence.deprecate(text) is
  'Operator: the active lease becomes draining (it finishes what it holds, claims nothing); returns its lease_id or NULL. Raises PF002.';

revoke all on table pgfence.leases, pgfence.invocations from public;
revoke all on sequence pgfence.generation from public;
revoke all on function pgfence.lease_not_current(uuid, timestamptz) from public;
revoke all on function pgfence.resource_not_found(text) from public;
revoke all on function pgfence.acquire(text, text, interval, uuid) from public;
revoke all on function pgfence.renew(uuid, interval) from public;
revoke all on function pgfence.drain(uuid) from public;
revoke all on function pgfence.release(uuid) from public;
revoke all on function pgfence.deprecate(text) from public;
grant execute on function pgfence.acquire(text, text, interval, uuid),
                          pgfence.renew(uuid, interval),
                          pgfence.drain(uuid),
                          pgfence.release(uuid)
   to pgfence_worker;
grant execute on function pgfence.deprecate(text) to pgfence_operator;

commit;

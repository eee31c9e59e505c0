-- Deploy pgfence:acquire
-- requires: limit_idle
-- requires: lease_judgement
-- requires: lock_resources
-- requires: leases
-- requires: invocations
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.acquire(resource text, owner text, ttl interval, invocation_id uuid default null)
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

  -- A first look without any lock: an unknown resource is refused, and a poller of a resource
  -- whose lease is current gets NULL without waiting for anybody.
  select r.enabled into v_enabled from pgfence.resources r where r.resource = acquire.resource;
  if not found then
    perform pgfence.resource_not_found(acquire.resource);
  end if;
  if acquire.invocation_id is null then
    if v_enabled and exists (select from pgfence.leases l
                              where l.resource = acquire.resource
                                and pgfence.is_current(l.state, l.expires_at)) then
      return null;
    end if;
    -- The resource row serializes acquirers. A poller does not queue for it behind whoever
    -- holds it (another acquirer, an operator, a session that acquired and then idled or
    -- prepared its transaction): it answers NULL at once and polls again later.
    select r.enabled into v_enabled
      from pgfence.resources r
     where r.resource = acquire.resource
       for no key update skip locked;
    if not found then
      return null;
    end if;
  else
    -- A worker started for this invocation waits for its answer, but not forever.
    perform pgfence.lock_resources(array[acquire.resource]);
    select r.enabled into v_enabled from pgfence.resources r where r.resource = acquire.resource;
  end if;
  perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
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
              where l.resource = acquire.resource and pgfence.is_current(l.state, l.expires_at)) then
    return null;
  end if;

  select * into v_current
    from pgfence.leases l
   where l.resource = acquire.resource and l.state = 'active'
     for update;
  -- Judged after the lock wait on the clock of this moment, never now(): the wait may have
  -- been long and the owner may have renewed meanwhile (I7).
  if found then
    if pgfence.is_current(v_current.state, v_current.expires_at) then
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

revoke all on function pgfence.acquire(text, text, interval, uuid) from public;
grant execute on function pgfence.acquire(text, text, interval, uuid) to pgfence_worker;

commit;

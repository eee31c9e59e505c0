-- Deploy pgfence:errors
-- requires: schema
-- requires: ref

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Every function raises 22023 naming the argument it refuses, before it changes anything.
create or replace function pgfence.invalid_argument(arg text, problem text, got text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_got text := got;
  v_id text;
begin
  -- What was given is shown, but an id in it (a lease id, an attempt id: capabilities) only
  -- by its digest (pgfence.ref): every caller at once, complete_many's lists too.
  for v_id in select m[1] from regexp_matches(got, '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})', 'gi') m loop
    v_got := replace(v_got, v_id, 'ref ' || pgfence.ref(v_id::pg_catalog.uuid));
  end loop;
  raise exception 'pgfence: invalid argument %: %', arg, problem
    using errcode = '22023',
          detail = case when got is null then 'got NULL' else format('got %s', left(v_got, 200)) end,
          hint = 'see docs/contract.md for the accepted values';
end
$$;

-- Raises PF001 with the reason a lease authorizes nothing. Callers hold no lock they need
-- after this: the exception rolls the statement back.
-- expired_at: the expiry the caller found passed, when its own uncommitted write hides it.
-- PF001 names the lease by its resource and generation (what an operator reads in
-- resource_status), and an unknown one by its digest: never by its id, which is a capability
-- (a draining lease, refused by fence, can still renew and release under it).
create or replace function pgfence.lease_not_current(lease_id uuid, expired_at timestamptz default null)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_lease pgfence.leases;
  v_reason text;
begin
  select * into v_lease from pgfence.leases l where l.lease_id = lease_not_current.lease_id;
  if not found then
    raise exception 'pgfence: lease ref % is not current (unknown)', pgfence.ref(lease_not_current.lease_id)
      using errcode = 'PF001',
            hint = 'stop working under this lease; acquire a new one before claiming or writing';
  end if;
  v_reason := case when lease_not_current.expired_at is not null
                   then 'expired at ' || lease_not_current.expired_at
                   when v_lease.state in ('active', 'draining') and v_lease.expires_at <= clock_timestamp()
                   then 'expired at ' || v_lease.expires_at
                   else v_lease.state end;
  raise exception 'pgfence: lease of % generation % is not current (%)', v_lease.resource, v_lease.generation, v_reason
    using errcode = 'PF001', detail = format('lease ref %s', pgfence.ref(lease_not_current.lease_id)),
          hint = 'stop working under this lease; acquire a new one before claiming or writing';
end
$$;

create or replace function pgfence.resource_not_found(resource text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'pgfence: resource % is not registered', resource
    using errcode = 'PF002', hint = 'register it first with pgfence.register(resource)';
end
$$;

create or replace function pgfence.unknown_attempt(attempt_id uuid)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.invalid_argument('attempt_id', 'no such attempt', attempt_id::text);
end
$$;

create or replace function pgfence.update_not_found(token uuid)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'pgfence: update ref % does not exist', pgfence.ref(token)
    using errcode = 'PF005', hint = 'check the token prepare_update returned; open windows are listed in pgfence.open_updates';
end
$$;

revoke all on function pgfence.invalid_argument(text, text, text) from public;
revoke all on function pgfence.lease_not_current(uuid, timestamptz) from public;
revoke all on function pgfence.resource_not_found(text) from public;
revoke all on function pgfence.unknown_attempt(uuid) from public;
revoke all on function pgfence.update_not_found(uuid) from public;
-- pgfence.protect runs as the operator and raises these for a bad argument or an unknown name.
grant execute on function pgfence.invalid_argument(text, text, text), pgfence.resource_not_found(text)
   to pgfence_operator;

commit;

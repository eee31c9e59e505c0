-- Deploy pgfence:errors
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Every function raises 22023 naming the argument it refuses, before it changes anything.
create function pgfence.invalid_argument(arg text, problem text, got text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception 'pgfence: invalid argument %: %', arg, problem
    using errcode = '22023',
          detail = case when got is null then 'got NULL' else format('got %s', left(got, 200)) end,
          hint = 'see docs/contract.md for the accepted values';
end
$$;

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

create function pgfence.unknown_attempt(attempt_id uuid)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.invalid_argument('attempt_id', 'no such attempt', attempt_id::text);
end
$$;

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

revoke all on function pgfence.invalid_argument(text, text, text) from public;
revoke all on function pgfence.lease_not_current(uuid, timestamptz) from public;
revoke all on function pgfence.resource_not_found(text) from public;
revoke all on function pgfence.unknown_attempt(uuid) from public;
revoke all on function pgfence.update_not_found(uuid) from public;
-- pgfence.protect runs as the operator and raises these for a bad argument or an unknown name.
grant execute on function pgfence.invalid_argument(text, text, text), pgfence.resource_not_found(text)
   to pgfence_operator;

commit;

-- Deploy pgfence:resources
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create table pgfence.resources (
  resource      text primary key,
  enabled       boolean not null,
  -- Bumped by every change of enabled, so an update window can tell an operator's change
  -- inside the window (even to the same value) from its own.
  enabled_version bigint not null default 0,
  registered_at timestamptz not null default clock_timestamp()
);
comment on table pgfence.resources is 'Registered resources. Not a public interface: use the functions and views.';

create function pgfence.register(resource text, enabled boolean default true)
returns void
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_name('resource', register.resource);
  perform pgfence.check_not_null('enabled', register.enabled);
  -- An existing resource keeps its enabled: registration never enables anything (I6).
  insert into pgfence.resources (resource, enabled)
  values (register.resource, register.enabled)
  on conflict on constraint resources_pkey do nothing;
end
$$;
comment on function pgfence.register(text, boolean) is
  'Registers a resource; idempotent. Never changes an existing resource''s enabled. Raises 22023 on a bad name.';

create function pgfence.set_enabled(resource text, enabled boolean)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_previous boolean;
begin
  perform pgfence.check_name('resource', set_enabled.resource);
  perform pgfence.check_not_null('enabled', set_enabled.enabled);
  select r.enabled into v_previous
    from pgfence.resources r
   where r.resource = set_enabled.resource
     for no key update;
  if not found then
    raise exception 'pgfence: resource % is not registered', set_enabled.resource
      using errcode = 'PF002', hint = 'register it first with pgfence.register(resource)';
  end if;
  update pgfence.resources r
     set enabled = set_enabled.enabled,
         enabled_version = r.enabled_version + 1
   where r.resource = set_enabled.resource;
  return v_previous;
end
$$;
comment on function pgfence.set_enabled(text, boolean) is
  'Operator: sets enabled and returns the previous value. Raises PF002 for an unknown resource.';

revoke all on table pgfence.resources from public;
revoke all on function pgfence.register(text, boolean) from public;
revoke all on function pgfence.set_enabled(text, boolean) from public;
grant execute on function pgfence.register(text, boolean) to pgfence_worker, pgfence_operator;
grant execute on function pgfence.set_enabled(text, boolean) to pgfence_operator;

commit;

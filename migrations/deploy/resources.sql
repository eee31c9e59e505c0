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

revoke all on table pgfence.resources from public;
-- pgfence.protect runs as the operator and looks up the registered names.
grant select on table pgfence.resources to pgfence_operator;

commit;

-- Deploy pgfence:updates
-- requires: resources
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

revoke all on table pgfence.updates, pgfence.update_items from public;

commit;

-- Deploy pgfence:invocations
-- requires: resources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

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

revoke all on table pgfence.invocations from public;

commit;

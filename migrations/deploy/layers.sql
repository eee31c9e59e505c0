-- Deploy pgfence:layers

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The optional layers installed (layers/*): each registers itself here on install, so that the
-- core counts their work without naming any. in_flight (resources text[]) returns
-- table(resource text, kind text, in_flight bigint): work started under one of a resource's
-- leases and not finished (update_status sums it); leases () returns setof uuid: the leases
-- its unfinished work names, which pgfence.prune keeps (a late result may still need one, as a
-- task's does: the guard of a protected table is shown its resource); prune (older_than interval) returns
-- table(what text, rows bigint), as pgfence.prune; health () returns table("check" text,
-- ok boolean, detail text), as pgfence.health.
create table pgfence.layers (
  schema_name name primary key check (schema_name like 'pgfence\_%'),
  in_flight   regprocedure not null,
  leases      regprocedure not null,
  prune       regprocedure,
  health      regprocedure
);
comment on table pgfence.layers is
  'The optional layers installed, each with its in_flight, leases, prune and health functions. Written by layer installs.';

revoke all on table pgfence.layers from public;
grant select on table pgfence.layers to pgfence_monitor, pgfence_operator;

commit;

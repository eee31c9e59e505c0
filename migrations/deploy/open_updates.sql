-- Deploy pgfence:open_updates
-- requires: updates

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create view pgfence.open_updates as
select u.token, u.resources, u.prepared_at
  from pgfence.updates u
 where u.finished_at is null;
comment on view pgfence.open_updates is 'Update windows not yet finished. They never expire or finish by themselves.';

revoke all on pgfence.open_updates from public;
grant select on pgfence.open_updates to pgfence_operator, pgfence_monitor;

commit;

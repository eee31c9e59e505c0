-- Deploy pgfence:schema
-- requires: roles

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create schema pgfence;
comment on schema pgfence is 'pgfence: database-authorized ownership, fencing tokens and fenced work.';
revoke all on schema pgfence from public;
grant usage on schema pgfence to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

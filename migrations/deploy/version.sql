-- Deploy pgfence:version
-- requires: releases
--
-- The release this database holds: the one sealed last (pgfence.seal, which each release's
-- one change calls). Until 0.2.1 this was a literal that every release reworked; 0.3.0 reworks
-- it for the last time.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.version()
returns text
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$ select pgfence.installed_release('pgfence') $$;
comment on function pgfence.version() is 'The pgfence release installed in this database, e.g. 0.3.0.';

revoke all on function pgfence.version() from public;
grant execute on function pgfence.version() to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

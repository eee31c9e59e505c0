-- Revert pgfence:version: back to its definition of release 0.2.0
--
-- The release this database holds. Every release reworks this change (scripts/bundle checks
-- that a release's tag and version() agree), so an upgrade file and the CLI can tell what
-- they are upgrading from.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.version()
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$ select '0.2.0'::pg_catalog.text $$;
comment on function pgfence.version() is 'The pgfence release installed in this database, e.g. 0.1.0.';

revoke all on function pgfence.version() from public;
grant execute on function pgfence.version() to pgfence_worker, pgfence_operator, pgfence_monitor;

-- health() compares the schema with the manifest of what the release installed: its row for
-- this function follows the new body.
insert into pgfence.manifest
select o.object, o.digest from pgfence.schema_objects() o
 where o.object = 'function pgfence.version()'
on conflict (object) do update set digest = excluded.digest;

commit;

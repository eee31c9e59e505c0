-- Deploy pgfence:version
-- requires: schema
-- requires: health
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

-- The first change after release 0.2.0: Sqitch runs it only on a database its registry says
-- holds 0.2.0. One that says another release was installed or upgraded by another path (the
-- one file, its upgrade files, the CLI) is refused before anything changes; the fix is to
-- record what the database holds. (In sql/pgfence.sql version() does not exist yet at this
-- point; in the upgrade from 0.2.0 it says 0.2.0.)
do $guard$
declare
  v_found text;
begin
  if pg_catalog.to_regprocedure('pgfence.version()') is not null then
    execute 'select pgfence.version()' into v_found;
    if v_found is distinct from '0.2.0' then
      raise exception 'pgfence: this database holds pgfence %, not 0.2.0 as the Sqitch registry '
                      'says: it was installed or upgraded without Sqitch; nothing was deployed',
                      v_found
        using errcode = '55000',
              hint = pg_catalog.format('record what it holds instead of deploying it: '
                                       'sqitch deploy --log-only --to @v%s, then sqitch verify '
                                       '(docs/upgrading.md, "Moving onto Sqitch")', v_found);
    end if;
  end if;
end
$guard$;

create or replace function pgfence.version()
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$ select '0.2.1'::pg_catalog.text $$;
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

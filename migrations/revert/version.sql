-- Revert pgfence:version: back to its definition of release 0.2.1 (a literal)

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.version()
returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.2.1'::pg_catalog.text $$;
comment on function pgfence.version() is 'The pgfence release installed in this database, e.g. 0.1.0.';

commit;

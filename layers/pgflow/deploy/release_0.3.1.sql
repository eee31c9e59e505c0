-- Deploy pgfence_pgflow:release_0.3.1
--
-- The layer's release, its one change, kept last in its section of the plan (move its line to
-- the end when adding a change after it): lockdown, the record of the schema, the release.
-- Needs pgfence 0.3.1 (pgfence.seal).

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.seal('pgfence_pgflow', '0.3.1'); end $$;

commit;

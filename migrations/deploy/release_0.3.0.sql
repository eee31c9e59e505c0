-- Deploy pgfence:release_0.3.0
-- requires: releases
--
-- The release's one change, kept last in its section of the plan (move its line to the end
-- when adding a change after it): lockdown, the record of the schema, the version.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.seal('pgfence', '0.3.0'); end $$;

commit;

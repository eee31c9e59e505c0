-- Deploy pgfence:release_0.3.1
-- requires: releases
--
-- The release's one change, kept last in its section of the plan (move its line to the end
-- when adding a change after it): lockdown, the record of the schema, the version. It checks
-- the release it follows as the section's first change does (expect_release): sealing 0.3.1
-- over anything but 0.3.0 would record a schema no release file has.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.expect_release('pgfence', '0.3.0'); end $$;
do $$ begin perform pgfence.seal('pgfence', '0.3.1'); end $$;

commit;

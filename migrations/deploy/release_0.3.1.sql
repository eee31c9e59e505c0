-- Deploy pgfence:release_0.3.1
-- requires: releases
--
-- The release's one change, kept last in its section of the plan (move its line to the end
-- when adding a change after it): lockdown, the record of the schema, the version. While it
-- is the first change after @v0.3.0 it also guards the section: Sqitch deploys it only over
-- 0.3.0 as released.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.expect_release('pgfence', '0.3.0'); end $$;
do $$ begin perform pgfence.seal('pgfence', '0.3.1'); end $$;

commit;

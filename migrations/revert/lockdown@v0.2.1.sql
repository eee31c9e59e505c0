-- Revert pgfence:lockdown: back to release 0.2.0
--
-- Release 0.2.1 reworked this change only to run it last again: the function is 0.2.0's, so
-- nothing is undone. The lockdown runs again, as after every step.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.lockdown('pgfence'); end $$;

commit;

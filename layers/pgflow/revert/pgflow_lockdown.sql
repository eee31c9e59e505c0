-- Revert pgfence_pgflow:pgflow_lockdown: back to release 0.2.0
--
-- The rework only runs the lockdown last again: nothing to undo but to run it once more, as
-- after every step.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.lockdown('pgfence_pgflow'); end $$;

commit;

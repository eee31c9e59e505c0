-- Revert pgfence_pgflow:kinds: back to release 0.3.0's kinds, which are the same (the rework
-- of 0.3.1 only runs it again after pgflow_start_tasks): nothing to undo.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

commit;

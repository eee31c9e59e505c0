-- Deploy pgfence_pgflow:pgflow_lockdown
-- requires: pgflow_schema
-- requires: pgflow_attempts
-- requires: pgflow_start_tasks
-- requires: pgflow_finish
-- requires: pgflow_in_flight
-- requires: pgflow_prune_health
-- requires: pgflow_workers
--
-- The last change: the core's lockdown, applied to this layer's schema. Whatever default
-- privileges the database carries (Supabase's hand new functions and tables to anon and
-- authenticated), nobody but the owner and the three pgfence roles keeps a privilege here.
--
-- Each release that changes the layer reworks this change, so that the upgrade ends with it
-- too (0.2.1: after the reworked start_tasks; Sqitch refuses two changes with the same script).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.lockdown('pgfence_pgflow'); end $$;

commit;

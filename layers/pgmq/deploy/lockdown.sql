-- Deploy pgfence_pgmq:lockdown
-- requires: schema
-- requires: attempts
-- requires: read
-- requires: finish
-- requires: archive
-- requires: delete
-- requires: set_vt
-- requires: in_flight
-- requires: prune_health
--
-- The last change: the core's lockdown, applied to this layer's schema. Whatever default
-- privileges the database carries (Supabase's hand new functions and tables to anon and
-- authenticated), nobody but the owner and the three pgfence roles keeps a privilege here.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.lockdown('pgfence_pgmq'); end $$;

commit;

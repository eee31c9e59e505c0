-- Deploy pgfence:limit_idle
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A worker may call pgfence inside a transaction of its own and then idle. Every function
-- that locks rows other sessions need (a resource row, a lease row, a task row) calls this
-- after taking the lock: the transaction may then stay idle at most 5 seconds (the bound an
-- operator's lock wait has too, lock_resources), after which PostgreSQL ends the session and
-- the lock goes with it. So no worker, holding a lease or not, keeps a successor off longer
-- (issue 26). For that transaction only (set_config's is_local): a later transaction on the
-- same pooled connection is not limited. A caller's own shorter limit is kept; fence and claim
-- set theirs (what the lease had left, hold_current), and the shorter one wins. Called by
-- SECURITY DEFINER functions only, on hot paths (renew, complete), so no SET of its own;
-- every name is qualified. (The setting is compared as text first: '0' needs no parsing.)
create function pgfence.limit_idle()
returns void
language plpgsql
as $$
declare
  v_set text := pg_catalog.current_setting('idle_in_transaction_session_timeout');
begin
  if v_set operator(pg_catalog.=) '0'
     or v_set::pg_catalog.interval operator(pg_catalog.>) '5 s'::pg_catalog.interval then
    perform pg_catalog.set_config('idle_in_transaction_session_timeout', '5s', true);
  end if;
end
$$;
comment on function pgfence.limit_idle() is
  'Limits how long the calling transaction may stay idle to 5 s (a shorter limit is kept): '
  'called after locking rows other sessions need, so that no idle transaction wedges them.';

revoke all on function pgfence.limit_idle() from public;

commit;

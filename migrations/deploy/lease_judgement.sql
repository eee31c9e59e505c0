-- Deploy pgfence:lease_judgement
-- requires: leases
-- requires: errors
--
-- The lease judgement, written once. Every function and view that asks whether a lease
-- authorizes anything asks these: fence, claim, acquire, request_start, update_status and the
-- views (is_current); renew and drain (is_live); and what works under a lease, fence and claim
-- today, the pgmq and pgflow layers later (hold_current, which also takes the lock).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The one active lease of its resource, and not expired on the clock of this moment: the only
-- lease that may claim or write (I1, I7). Expiry is judged with clock_timestamp(), never
-- now(): a long transaction must not keep an expired lease alive. An expression its callers
-- inline (LANGUAGE sql, no SET, declared as volatile as its body, every name qualified), so a
-- query keeps its plan: leases_one_active still serves `where pgfence.is_current(...)`.
create function pgfence.is_current(state text, expires_at timestamptz)
returns boolean
language sql
volatile
as $$
  select is_current.state operator(pg_catalog.=) 'active'
     and is_current.expires_at operator(pg_catalog.>) pg_catalog.clock_timestamp();
$$;
comment on function pgfence.is_current(text, timestamptz) is
  'Whether a lease with this state and expiry is current now: active and not expired (clock_timestamp()).';

-- Active or draining, and not expired: a lease that may still renew, drain and finish what it
-- holds, but (when draining) claims and writes nothing.
create function pgfence.is_live(state text, expires_at timestamptz)
returns boolean
language sql
volatile
as $$
  select is_live.state operator(pg_catalog.=) any ('{active,draining}'::pg_catalog.text[])
     and is_live.expires_at operator(pg_catalog.>) pg_catalog.clock_timestamp();
$$;
comment on function pgfence.is_live(text, timestamptz) is
  'Whether a lease with this state and expiry is live now: active or draining, and not expired.';

-- The lease-current check of everything that works under a lease. FOR KEY SHARE on the lease
-- row, held to the end of the caller's transaction: a takeover, drain, release or deprecate
-- needs FOR UPDATE on it and waits until then (I2), while renewals (FOR NO KEY UPDATE) and
-- other fences of the same lease go on. Judged after the lock wait (I7). Called by SECURITY
-- DEFINER functions only (nobody else may execute it), so it has no SET of its own, which
-- would cost every fence and claim a save and restore of search_path; every name is qualified.
create function pgfence.hold_current(lease_id uuid)
returns pgfence.leases
language plpgsql
as $$
declare
  v_lease pgfence.leases;
  v_left int8;  -- milliseconds the lease has left
  v_set text;
begin
  select l.* into v_lease
    from pgfence.leases l
   where l.lease_id operator(pg_catalog.=) hold_current.lease_id
     for key share;
  if not found or not pgfence.is_current(v_lease.state, v_lease.expires_at) then
    -- Arguments are checked here, on the way out, not before the lookup: a NULL id finds no
    -- row, and every fence and claim is spared the call (issue 18).
    perform pgfence.check_not_null('lease_id', hold_current.lease_id);
    perform pgfence.lease_not_current(hold_current.lease_id);
  end if;
  -- The lock is held until the caller's transaction ends, and takeovers wait for it (I2). An
  -- owner frozen inside that transaction (paused, partitioned, its client gone quiet) would
  -- hold off every successor until its backend died. So the transaction may stay idle no
  -- longer than the lease had left: then PostgreSQL ends the session, the lock goes, and a
  -- successor gets the resource at most that long after the lease's expiry. A caller's own
  -- shorter idle_in_transaction_session_timeout is kept. (The setting is compared as text
  -- first: '0', PostgreSQL's default, needs no parsing.)
  v_left := pg_catalog.ceil(pg_catalog.date_part('epoch', v_lease.expires_at operator(pg_catalog.-)
                                                  pg_catalog.clock_timestamp()) operator(pg_catalog.*) 1000);
  v_set := pg_catalog.current_setting('idle_in_transaction_session_timeout');
  if v_left operator(pg_catalog.>) 0
     and (v_set operator(pg_catalog.=) '0'
          or v_set::pg_catalog.interval operator(pg_catalog.>)
             pg_catalog.make_interval(secs => v_left operator(pg_catalog./) 1000.0)) then
    perform pg_catalog.set_config('idle_in_transaction_session_timeout', v_left::pg_catalog.text, true);
  end if;
  return v_lease;
end
$$;
comment on function pgfence.hold_current(uuid) is
  'Locks the lease FOR KEY SHARE to the end of the transaction and returns it if it is current (PF001 otherwise); '
  'the transaction may then stay idle at most as long as the lease had left.';

revoke all on function pgfence.is_current(text, timestamptz), pgfence.is_live(text, timestamptz),
                       pgfence.hold_current(uuid)
  from public;
-- The views ask is_current as their reader: a function in a view runs (and is inlined) only
-- with the reader's own EXECUTE. It reveals nothing: it judges the two values it is given.
grant execute on function pgfence.is_current(text, timestamptz) to pgfence_monitor, pgfence_operator;

commit;

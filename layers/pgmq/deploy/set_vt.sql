-- Deploy pgfence_pgmq:set_vt
-- requires: attempts
-- requires: attempts_order
--
-- Reworked in 0.3.0: NULL once a later read of the message exists (as finish judges); the
-- transaction may then idle at most 5 s (it holds the message row: pgfence.limit_idle) and
-- waits for it at most 5 s (pgfence.limit_lock_wait: 55P03, which the clients retry); the guard
-- is shown the lease's resource by the core (pgfence.mark_lease).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A long handler keeps its message: like pgfence.extend, by the attempt alone.
create or replace function pgfence_pgmq.set_vt(attempt_id uuid, vt interval)
returns timestamptz
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence_pgmq.attempts;
  v_table text;
  v_vt timestamptz;
  v_was text;
  v_lock_wait text;
begin
  perform pgfence.check_not_null('attempt_id', set_vt.attempt_id);
  perform pgfence.check_interval('vt', set_vt.vt);
  select * into v_attempt from pgfence_pgmq.attempts a where a.attempt_id = set_vt.attempt_id;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence_pgmq.read',
                                     set_vt.attempt_id::text);
  end if;
  -- Finished, or read again since (a later read in the layer's record): it holds nothing.
  if v_attempt.outcome is not null
     or exists (select from pgfence_pgmq.attempts b
                 where b.queue = v_attempt.queue and b.msg_id = v_attempt.msg_id
                   and coalesce(b.read_order, 0) > coalesce(v_attempt.read_order, 0)) then
    return null;
  end if;
  v_table := pgfence_pgmq.queue_table(v_attempt.queue);
  perform pgfence_pgmq.check_allowed(v_table, 'update');
  v_was := pgfence.mark_lease(v_attempt.lease_id, pg_catalog.to_regclass(format('pgmq.%I', v_table)));
  -- The message row: waited for at most 5 s, then held by an idle transaction at most 5 s.
  v_lock_wait := pgfence.limit_lock_wait();
  execute format('update pgmq.%I m set vt = clock_timestamp() + $4 '
                 'where m.msg_id = $1 and m.read_ct = $2 and m.enqueued_at = $3 returning m.vt', v_table)
     into v_vt using v_attempt.msg_id, v_attempt.read_ct, v_attempt.enqueued_at, set_vt.vt;
  perform set_config('lock_timeout', v_lock_wait, true);
  perform pgfence.limit_idle();
  if v_was is not null then
    perform set_config('pgfence.fenced', v_was, true);
  end if;
  return v_vt;
end
$$;
comment on function pgfence_pgmq.set_vt(uuid, interval) is
  'A long handler keeps its message: visible again vt from now. NULL when the message was read again since, '
  'or finished. Raises 42501, 22023 for an unknown attempt, 55P03 when another session holds the message over 5 s.';

revoke all on function pgfence_pgmq.set_vt(uuid, interval) from public;
grant execute on function pgfence_pgmq.set_vt(uuid, interval) to pgfence_worker;

commit;

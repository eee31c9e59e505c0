-- Deploy pgfence_pgmq:pgmq_finish
-- requires: pgmq_attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- archive and delete share one rule (I5), the one of pgfence's own complete and fail: the
-- result of the attempt that holds the message is accepted, even after its lease expired or
-- drained, as long as nobody read the message again since (its read_ct is still the one this
-- attempt's read gave it). Otherwise it is stale, and recorded in pgfence.stale_results.
create function pgfence.pgmq_finish(attempt_id uuid, kind text)
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence.pgmq_attempts;
  v_read_ct int;
  v_was text;
begin
  perform pgfence.check_not_null('attempt_id', pgmq_finish.attempt_id);
  -- Locked, so that two calls of one attempt are decided one after the other.
  select * into v_attempt from pgfence.pgmq_attempts a where a.attempt_id = pgmq_finish.attempt_id for update;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.pgmq_read',
                                     pgmq_finish.attempt_id::text);
  end if;
  if v_attempt.outcome is not null then
    return 'duplicate';
  end if;
  -- The message row is locked to the end of the transaction: a reader that has it (read, not
  -- yet committed) is waited for, and the read count judged after it; a reader that comes
  -- later skips it (SKIP LOCKED), and finds it gone if the result is accepted.
  execute format('select m.read_ct from pgmq.%I m where m.msg_id = $1 for update',
                 pgfence.pgmq_queue_table(v_attempt.queue))
     into v_read_ct using v_attempt.msg_id;
  if v_read_ct is distinct from v_attempt.read_ct then
    -- Read again since, or gone (finished by a newer attempt, or by hand). Each kind of result
    -- of a stale attempt is kept once; a retry of one adds nothing.
    if not exists (select from pgfence.stale_results s
                    where s.attempt_id = pgmq_finish.attempt_id and s.kind = pgmq_finish.kind) then
      insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body, report, pgmq_queue)
      values (pgmq_finish.attempt_id, v_attempt.msg_id, v_attempt.read_ct, pgmq_finish.kind, null,
              (select coalesce(max(s.report), 0) + 1 from pgfence.stale_results s
                where s.attempt_id = pgmq_finish.attempt_id),
              v_attempt.queue);
    end if;
    return 'stale';
  end if;
  -- Accepted: this one write is authorized by the attempt, whose lease may have expired since,
  -- so the guard of a protected queue table is shown the lease's resource for it alone.
  v_was := pgfence.mark_fenced((select l.resource from pgfence.leases l where l.lease_id = v_attempt.lease_id),
                               (select k.hmac_key from pgfence.signing_key k));
  if pgmq_finish.kind = 'archive' then
    perform pgmq.archive(v_attempt.queue, v_attempt.msg_id);
  else
    perform pgmq.delete(v_attempt.queue, v_attempt.msg_id);
  end if;
  perform set_config('pgfence.fenced', v_was, true);
  update pgfence.pgmq_attempts a
     set outcome = pgmq_finish.kind, finished_at = clock_timestamp()
   where a.attempt_id = pgmq_finish.attempt_id;
  return 'accepted';
end
$$;

create function pgfence.pgmq_archive(attempt_id uuid)
returns text
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select pgfence.pgmq_finish(pgmq_archive.attempt_id, 'archive');
$$;
comment on function pgfence.pgmq_archive(uuid) is
  'Archives the message of an attempt (pgmq.archive): accepted while nobody read it again since, also after '
  'the lease expired; duplicate for a retry of an accepted attempt; stale (recorded in pgfence.stale_results) '
  'otherwise. Raises 22023 for an unknown attempt.';

create function pgfence.pgmq_delete(attempt_id uuid)
returns text
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select pgfence.pgmq_finish(pgmq_delete.attempt_id, 'delete');
$$;
comment on function pgfence.pgmq_delete(uuid) is
  'Deletes the message of an attempt (pgmq.delete), by the rule of pgmq_archive.';

-- A long handler keeps its message: like pgfence.extend, by the attempt alone.
create function pgfence.pgmq_set_vt(attempt_id uuid, vt interval)
returns timestamptz
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence.pgmq_attempts;
  v_vt timestamptz;
  v_was text;
begin
  perform pgfence.check_not_null('attempt_id', pgmq_set_vt.attempt_id);
  perform pgfence.check_interval('vt', pgmq_set_vt.vt);
  select * into v_attempt from pgfence.pgmq_attempts a where a.attempt_id = pgmq_set_vt.attempt_id;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.pgmq_read',
                                     pgmq_set_vt.attempt_id::text);
  end if;
  if v_attempt.outcome is not null then
    return null;
  end if;
  v_was := pgfence.mark_fenced((select l.resource from pgfence.leases l where l.lease_id = v_attempt.lease_id),
                               (select k.hmac_key from pgfence.signing_key k));
  execute format('update pgmq.%I m set vt = clock_timestamp() + $3 where m.msg_id = $1 and m.read_ct = $2 '
                 'returning m.vt', pgfence.pgmq_queue_table(v_attempt.queue))
     into v_vt using v_attempt.msg_id, v_attempt.read_ct, pgmq_set_vt.vt;
  perform set_config('pgfence.fenced', v_was, true);
  return v_vt;
end
$$;
comment on function pgfence.pgmq_set_vt(uuid, interval) is
  'A long handler keeps its message: visible again vt from now. NULL when the message was read again since, '
  'or finished. Raises 22023 for an unknown attempt.';

revoke all on function pgfence.pgmq_finish(uuid, text), pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid),
                       pgfence.pgmq_set_vt(uuid, interval)
  from public;
grant execute on function pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid), pgfence.pgmq_set_vt(uuid, interval)
   to pgfence_worker;

commit;

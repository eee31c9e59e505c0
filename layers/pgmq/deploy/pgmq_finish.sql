-- Deploy pgfence_pgmq:pgmq_finish
-- requires: pgmq_attempts

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A result admitted by its attempt writes a queue table that may be protected: the guard is
-- shown the attempt's lease's resource (pgfence.mark_fenced) for that one write, and the
-- caller puts back what this returns (NULL: the table is not protected, nothing was marked;
-- the keyed hash is spent only where a guard will look for it).
create function pgfence.pgmq_mark(queue_table text, lease_id uuid)
returns text
language sql
as $$
  select pgfence.mark_fenced(l.resource, k.hmac_key)
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) pgmq_mark.lease_id
     and exists (select from pgfence.protections p
                  where p.tbl operator(pg_catalog.=)
                        pg_catalog.to_regclass('pgmq.' operator(pg_catalog.||) pgmq_mark.queue_table));
$$;

-- archive and delete share one rule (I5), the one of pgfence's own complete and fail: the
-- result of the attempt that holds the message is accepted, even after its lease expired or
-- drained, as long as nobody read the message again since (its read_ct is still the one this
-- attempt's read gave it). Otherwise it is stale, and recorded in pgfence.stale_results.
create function pgfence.pgmq_finish(attempt_id uuid, kind text)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt pgfence.pgmq_attempts;
  v_table text;
  v_done bigint;
  v_was text;
begin
  perform pgfence.check_not_null('attempt_id', pgmq_finish.attempt_id);
  if pgmq_finish.kind is null or pgmq_finish.kind not in ('archive', 'delete') then
    perform pgfence.invalid_argument('kind', 'must be archive or delete', pgmq_finish.kind);
  end if;
  -- Locked, so that two calls of one attempt are decided one after the other.
  select * into v_attempt from pgfence.pgmq_attempts a where a.attempt_id = pgmq_finish.attempt_id for update;
  if not found then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.pgmq_read',
                                     pgmq_finish.attempt_id::text);
  end if;
  if v_attempt.outcome is not null then
    return 'duplicate';
  end if;
  v_table := pgfence.pgmq_queue_table(v_attempt.queue);
  -- This one write is authorized by the attempt, whose lease may have expired since, so the
  -- guard of a protected queue table is shown the lease's resource for it alone.
  v_was := pgfence.pgmq_mark(v_table, v_attempt.lease_id);
  -- The check and the write are one statement: the message goes only if its read count is
  -- still this attempt's. A reader that holds the row (read, not yet committed) is waited for
  -- and the count judged on what it committed; a reader that comes later skips the row (SKIP
  -- LOCKED) and then finds it gone. pgmq.archive's own statement, with the read count added.
  if pgmq_finish.kind = 'archive' then
    execute format(
      'with gone as (delete from pgmq.%I m where m.msg_id = $1 and m.read_ct = $2'
      '              returning m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, m.headers) '
      'insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) '
      'select * from gone returning msg_id',
      v_table, 'a' || substr(v_table, 2))
      into v_done using v_attempt.msg_id, v_attempt.read_ct;
  else
    execute format('delete from pgmq.%I m where m.msg_id = $1 and m.read_ct = $2 returning m.msg_id', v_table)
      into v_done using v_attempt.msg_id, v_attempt.read_ct;
  end if;
  if v_was is not null then
    perform set_config('pgfence.fenced', v_was, true);
  end if;
  if v_done is null then
    -- Read again since, or gone (finished by a newer attempt, or by hand): stale. Each kind of
    -- result of a stale attempt is kept once; a retry of one adds nothing.
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
  update pgfence.pgmq_attempts a
     set outcome = pgmq_finish.kind, finished_at = clock_timestamp()
   where a.attempt_id = pgmq_finish.attempt_id;
  return 'accepted';
end
$$;
comment on function pgfence.pgmq_finish(uuid, text) is
  'pgmq_archive (kind archive) and pgmq_delete (kind delete). Raises 22023.';

-- The two names of the contract: inlined into the caller's query (LANGUAGE sql, no SET, not
-- SECURITY DEFINER, every name qualified), so a call costs one function's SET, not two.
create function pgfence.pgmq_archive(attempt_id uuid)
returns text
language sql
as $$
  select pgfence.pgmq_finish(pgmq_archive.attempt_id, 'archive');
$$;
comment on function pgfence.pgmq_archive(uuid) is
  'Archives the message of an attempt (as pgmq.archive): accepted while nobody read it again since, also after '
  'the lease expired; duplicate for a retry of an accepted attempt; stale (recorded in pgfence.stale_results) '
  'otherwise. Raises 22023 for an unknown attempt.';

create function pgfence.pgmq_delete(attempt_id uuid)
returns text
language sql
as $$
  select pgfence.pgmq_finish(pgmq_delete.attempt_id, 'delete');
$$;
comment on function pgfence.pgmq_delete(uuid) is
  'Deletes the message of an attempt (as pgmq.delete), by the rule of pgmq_archive.';

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
  v_was := pgfence.pgmq_mark(pgfence.pgmq_queue_table(v_attempt.queue), v_attempt.lease_id);
  execute format('update pgmq.%I m set vt = clock_timestamp() + $3 where m.msg_id = $1 and m.read_ct = $2 '
                 'returning m.vt', pgfence.pgmq_queue_table(v_attempt.queue))
     into v_vt using v_attempt.msg_id, v_attempt.read_ct, pgmq_set_vt.vt;
  if v_was is not null then
    perform set_config('pgfence.fenced', v_was, true);
  end if;
  return v_vt;
end
$$;
comment on function pgfence.pgmq_set_vt(uuid, interval) is
  'A long handler keeps its message: visible again vt from now. NULL when the message was read again since, '
  'or finished. Raises 22023 for an unknown attempt.';

revoke all on function pgfence.pgmq_mark(text, uuid), pgfence.pgmq_finish(uuid, text), pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid),
                       pgfence.pgmq_set_vt(uuid, interval)
  from public;
grant execute on function pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid), pgfence.pgmq_set_vt(uuid, interval),
                         pgfence.pgmq_finish(uuid, text)
   to pgfence_worker;

commit;

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
-- One mechanism for one attempt and for a batch: pgmq_archive(id) is this function over
-- array[id]. Outcomes are returned in the order of the ids.
create function pgfence.pgmq_finish(attempt_ids uuid[], kind text)
returns text[]
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- Its statements take arrays: costed for the array at hand, plpgsql would plan them again on
-- every call (as claim, which sets the same).
set plan_cache_mode = force_generic_plan
as $$
declare
  -- The rule in the dynamic statements below: a message goes only if its read count is still
  -- its attempt's. For several messages, the read count of the attempt with the highest one
  -- for each message: an attempt with a lower one was read again since, and is stale anyway.
  c_holds_one constant text := 'm.msg_id = $1 and m.read_ct = $2';
  c_holds_many constant text := 'm.msg_id = any ($1) and m.read_ct = ($2)[array_position($1, m.msg_id)]';
  v_n int := cardinality(pgmq_finish.attempt_ids);
  v_at int;
  v_found int;
  v_finished uuid[];   -- the attempts that had a result accepted before this call: duplicates
  v_queues text[];
  v_leases uuid[];
  v_msg_ids bigint[];  -- the messages still to finish, of one queue, each once
  v_read_cts int[];    -- and the read count each must still have
  v_attempts uuid[];   -- and the attempt that holds it if so
  v_queue text;
  v_table text;
  v_lease uuid;
  v_mark text;
  v_was text;
  v_one bigint;
  v_done bigint[];
  v_count int;
  v_accepted int := 0;
  v_outcomes text[];
begin
  -- Not check_not_null: a polymorphic function, it costs more per call than every other check here.
  if pgmq_finish.attempt_ids is null then
    perform pgfence.invalid_argument('attempt_ids', 'must not be NULL', null);
  end if;
  if v_n not between 1 and 1000 or array_ndims(pgmq_finish.attempt_ids) <> 1 then
    perform pgfence.invalid_argument('attempt_ids', 'must be a one-dimensional array of 1 to 1000 attempt ids',
                                     format('%s ids', v_n));
  end if;
  v_at := array_position(pgmq_finish.attempt_ids, null);
  if v_at is not null then
    perform pgfence.invalid_argument('attempt_ids', 'must not contain NULL', format('NULL at position %s', v_at));
  end if;
  if v_n > 1 then
    if (select count(distinct u.a) from unnest(pgmq_finish.attempt_ids) u(a)) <> v_n then
      perform pgfence.invalid_argument('attempt_ids', 'must not name an attempt twice',
        (select format('%s more than once', min(d.a::text))
           from (select u.a from unnest(pgmq_finish.attempt_ids) u(a) group by u.a having count(*) > 1) d));
    end if;
  end if;
  if pgmq_finish.kind is null or pgmq_finish.kind not in ('archive', 'delete') then
    perform pgfence.invalid_argument('kind', 'must be archive or delete', pgmq_finish.kind);
  end if;
  -- The attempts are locked, in attempt_id order, before anything is written: two calls of one
  -- attempt are decided one after the other, and two batches over overlapping attempts given
  -- in different orders cannot each hold one the other waits for (a deadlock). A message is
  -- written only through the one attempt whose read count it still has, so two finishers meet
  -- on a message row only through an attempt both hold, and the first of them to lock that
  -- attempt goes first; readers skip locked messages (SKIP LOCKED) and never wait for one.
  select count(*),
         array_agg(l.attempt_id) filter (where l.outcome is not null),
         array_agg(distinct l.queue) filter (where l.outcome is null),
         array_agg(distinct l.lease_id) filter (where l.outcome is null),
         array_agg(l.msg_id order by l.msg_id, l.read_ct desc) filter (where l.outcome is null),
         array_agg(l.read_ct order by l.msg_id, l.read_ct desc) filter (where l.outcome is null),
         array_agg(l.attempt_id order by l.msg_id, l.read_ct desc) filter (where l.outcome is null)
    into v_found, v_finished, v_queues, v_leases, v_msg_ids, v_read_cts, v_attempts
    from (select a.attempt_id, a.outcome, a.queue, a.lease_id, a.msg_id, a.read_ct
            from pgfence.pgmq_attempts a
           where a.attempt_id = any (pgmq_finish.attempt_ids)
           order by a.attempt_id
             for update) l;
  if v_found < v_n then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.pgmq_read',
      (select u.a::text from unnest(pgmq_finish.attempt_ids) with ordinality u(a, n)
        where not exists (select from pgfence.pgmq_attempts a where a.attempt_id = u.a)
        order by u.n limit 1));
  end if;
  -- Per queue, one statement over all its messages that have no result yet.
  foreach v_queue in array coalesce(v_queues, '{}') loop
    if cardinality(v_queues) > 1 then
      select array_agg(distinct a.lease_id), array_agg(a.msg_id order by a.msg_id, a.read_ct desc),
             array_agg(a.read_ct order by a.msg_id, a.read_ct desc), array_agg(a.attempt_id order by a.msg_id, a.read_ct desc)
        into v_leases, v_msg_ids, v_read_cts, v_attempts
        from pgfence.pgmq_attempts a
       where a.attempt_id = any (pgmq_finish.attempt_ids) and a.queue = v_queue and a.outcome is null;
    end if;
    v_table := pgfence.pgmq_queue_table(v_queue);
    -- These writes are authorized by the attempts, whose leases may have expired since, so the
    -- guard of a protected queue table is shown their resources for this statement alone.
    v_was := null;
    foreach v_lease in array v_leases loop
      v_mark := pgfence.pgmq_mark(v_table, v_lease);
      v_was := coalesce(v_was, v_mark);  -- the first: what was there before any of them
    end loop;
    -- The check and the write are one statement. A reader that holds a message's row (read,
    -- not yet committed) is waited for and the count judged on what it committed; a reader that
    -- comes later skips the row (SKIP LOCKED) and then finds it gone. pgmq.archive's own
    -- statement, with the read count added; for one message in the form pgmq.archive plans
    -- fastest (one message per call is the common case of pgmq_archive).
    if cardinality(v_msg_ids) = 1 and pgmq_finish.kind = 'archive' then
      execute format(
        'with gone as (delete from pgmq.%I m where %s'
        '              returning m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, m.headers) '
        'insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) '
        'select * from gone returning msg_id',
        v_table, c_holds_one, 'a' || substr(v_table, 2))
        into v_one using v_msg_ids[1], v_read_cts[1];
    elsif cardinality(v_msg_ids) = 1 then
      execute format('delete from pgmq.%I m where %s returning m.msg_id', v_table, c_holds_one)
        into v_one using v_msg_ids[1], v_read_cts[1];
    elsif pgmq_finish.kind = 'archive' then
      execute format(
        'with gone as (delete from pgmq.%I m where %s'
        '              returning m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, m.headers), '
        'moved as (insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) '
        '          select * from gone returning msg_id) '
        'select array_agg(msg_id) from moved',
        v_table, c_holds_many, 'a' || substr(v_table, 2))
        into v_done using v_msg_ids, v_read_cts;
    else
      execute format('with gone as (delete from pgmq.%I m where %s returning m.msg_id) select array_agg(msg_id) from gone',
                     v_table, c_holds_many)
        into v_done using v_msg_ids, v_read_cts;
    end if;
    if v_was is not null then
      perform set_config('pgfence.fenced', v_was, true);
    end if;
    -- What went is recorded on the attempt that held it.
    if cardinality(v_msg_ids) = 1 then
      if v_one is not null then
        update pgfence.pgmq_attempts a
           set outcome = pgmq_finish.kind, finished_at = clock_timestamp()
         where a.attempt_id = v_attempts[1];
        v_accepted := v_accepted + 1;
      end if;
    else
      update pgfence.pgmq_attempts a
         set outcome = pgmq_finish.kind, finished_at = clock_timestamp()
       where a.attempt_id = any (v_attempts) and a.msg_id = any (v_done)
         and a.read_ct = v_read_cts[array_position(v_msg_ids, a.msg_id)];
      get diagnostics v_count = row_count;
      v_accepted := v_accepted + v_count;
    end if;
  end loop;
  if v_accepted = v_n then
    return array_fill('accepted'::text, array[v_n]);
  end if;
  -- What has no result now was read again since, or is gone (finished by a newer attempt, or
  -- by hand): stale. Each kind of result of a stale attempt is kept once; a retry adds nothing.
  select array_agg(case when u.attempt_id = any (v_finished) then 'duplicate'
                        when a.outcome is not null then 'accepted'
                        else 'stale' end order by u.n)
    into v_outcomes
    from unnest(pgmq_finish.attempt_ids) with ordinality u(attempt_id, n)
    join pgfence.pgmq_attempts a on a.attempt_id = u.attempt_id;
  if 'stale' = any (v_outcomes) then
    insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body, report, pgmq_queue)
    select a.attempt_id, a.msg_id, a.read_ct, pgmq_finish.kind, null,
           (select coalesce(max(s.report), 0) + 1 from pgfence.stale_results s where s.attempt_id = a.attempt_id),
           a.queue
      from pgfence.pgmq_attempts a
     where a.attempt_id = any (pgmq_finish.attempt_ids) and a.outcome is null
       and not exists (select from pgfence.stale_results s
                        where s.attempt_id = a.attempt_id and s.kind = pgmq_finish.kind);
  end if;
  return v_outcomes;
end
$$;
comment on function pgfence.pgmq_finish(uuid[], text) is
  'pgmq_archive and pgmq_archive_many (kind archive), pgmq_delete and pgmq_delete_many (kind delete): '
  'the outcome of each attempt, in the order given. Raises 22023.';

-- The names of the contract: the single ones inlined into the caller's query (LANGUAGE sql, no
-- SET, not SECURITY DEFINER, every name qualified), so a call costs one function's SET, not two.
create function pgfence.pgmq_archive(attempt_id uuid)
returns text
language sql
as $$
  select (pgfence.pgmq_finish(array[pgmq_archive.attempt_id], 'archive'))[1];
$$;
comment on function pgfence.pgmq_archive(uuid) is
  'Archives the message of an attempt (as pgmq.archive): accepted while nobody read it again since, also after '
  'the lease expired; duplicate for a retry of an accepted attempt; stale (recorded in pgfence.stale_results) '
  'otherwise. Raises 22023 for an unknown attempt.';

create function pgfence.pgmq_delete(attempt_id uuid)
returns text
language sql
as $$
  select (pgfence.pgmq_finish(array[pgmq_delete.attempt_id], 'delete'))[1];
$$;
comment on function pgfence.pgmq_delete(uuid) is
  'Deletes the message of an attempt (as pgmq.delete), by the rule of pgmq_archive.';

-- The batches: one row per id, in the order given (plpgsql without SET, every name qualified:
-- its plan is kept, where a LANGUAGE sql function returning a set would be planned per call).
create function pgfence.pgmq_archive_many(attempt_ids uuid[])
returns table (attempt_id uuid, outcome text)
language plpgsql
as $$
begin
  return query
  select u.attempt_id, u.outcome
    from rows from (pg_catalog.unnest(pgmq_archive_many.attempt_ids),
                    pg_catalog.unnest(pgfence.pgmq_finish(pgmq_archive_many.attempt_ids, 'archive'))) as u(attempt_id, outcome);
end
$$;
comment on function pgfence.pgmq_archive_many(uuid[]) is
  'pgmq_archive for each attempt of attempt_ids, by its rule: one row per id, in the order given, outcome accepted, '
  'duplicate or stale; per queue one statement over all its messages. Raises 22023, changing nothing, for a NULL or '
  'empty array, more than 1000 ids, a NULL or repeated id, or any unknown attempt.';

create function pgfence.pgmq_delete_many(attempt_ids uuid[])
returns table (attempt_id uuid, outcome text)
language plpgsql
as $$
begin
  return query
  select u.attempt_id, u.outcome
    from rows from (pg_catalog.unnest(pgmq_delete_many.attempt_ids),
                    pg_catalog.unnest(pgfence.pgmq_finish(pgmq_delete_many.attempt_ids, 'delete'))) as u(attempt_id, outcome);
end
$$;
comment on function pgfence.pgmq_delete_many(uuid[]) is
  'pgmq_delete for each attempt of attempt_ids, by the rule of pgmq_archive_many.';

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

revoke all on function pgfence.pgmq_mark(text, uuid), pgfence.pgmq_finish(uuid[], text), pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid),
                       pgfence.pgmq_archive_many(uuid[]), pgfence.pgmq_delete_many(uuid[]), pgfence.pgmq_set_vt(uuid, interval)
  from public;
grant execute on function pgfence.pgmq_archive(uuid), pgfence.pgmq_delete(uuid), pgfence.pgmq_set_vt(uuid, interval),
                         pgfence.pgmq_archive_many(uuid[]), pgfence.pgmq_delete_many(uuid[]), pgfence.pgmq_finish(uuid[], text)
   to pgfence_worker;

commit;

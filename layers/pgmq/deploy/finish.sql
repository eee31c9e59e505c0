-- Deploy pgfence_pgmq:finish
-- requires: attempts
-- requires: attempts_order
--
-- Reworked in 0.3.0: an attempt is stale once a later read of its message exists, whatever
-- the message looks like now (a producer cannot revive a stale attempt); the transaction may
-- then idle at most 5 s (pgfence.limit_idle: it holds the attempts and messages others need)
-- and waits for a lock at most 5 s (pgfence.limit_lock_wait: 55P03, which the clients retry);
-- the guard is shown the lease's resource by the core (pgfence.mark_lease).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';


-- archive and delete share one rule (I5), the one of pgfence's own complete and fail: the
-- result of the attempt that holds the message is accepted, even after its lease expired or
-- drained, as long as nobody read the message again since (its read_ct is still the one this
-- attempt's read gave it, and the layer's record holds no later read of it). Otherwise it is
-- stale, and recorded in pgfence_pgmq.stale_results.
-- One mechanism for one attempt and for a batch: archive(id) is this function over
-- array[id]. Outcomes are returned in the order of the ids.
create or replace function pgfence_pgmq.finish(attempt_ids uuid[], kind text)
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
  -- The message is the one read (its enqueued_at too: a producer may insert a message again
  -- under an old msg_id, read_ct counting up from 0 again).
  c_holds_one constant text := 'm.msg_id = $1 and m.read_ct = $2 and m.enqueued_at = $3';
  c_holds_many constant text := 'm.msg_id = any ($1) and m.read_ct = ($2)[array_position($1, m.msg_id)] '
                                'and m.enqueued_at = ($3)[array_position($1, m.msg_id)]';
  v_n int := cardinality(finish.attempt_ids);
  v_found int;
  v_finished uuid[];   -- the attempts that had a result accepted before this call: duplicates
  v_queues text[];
  v_leases uuid[];
  v_msg_ids bigint[];  -- the messages still to finish, of one queue, each once
  v_read_cts int[];    -- and the read count each must still have
  v_enqueued timestamptz[];  -- and when it was enqueued
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
  v_lock_wait text;
begin
  perform pgfence.check_batch(finish.attempt_ids);
  if finish.kind is null or finish.kind not in ('archive', 'delete') then
    perform pgfence.invalid_argument('kind', 'must be archive or delete', finish.kind);
  end if;
  -- Another session's attempt or message rows are waited for at most 5 s (55P03 then: the
  -- clients send the result again), and this transaction, once it holds them, idles at most
  -- 5 s: no worker, current or stale, keeps a message from its successor.
  v_lock_wait := pgfence.limit_lock_wait();
  -- The attempts are locked, in attempt_id order, before anything is written: two calls of one
  -- attempt are decided one after the other, and two batches over overlapping attempts given
  -- in different orders cannot each hold one the other waits for (a deadlock). A message is
  -- written only through the one attempt whose read count it still has, so two finishers meet
  -- on a message row only through an attempt both hold, and the first of them to lock that
  -- attempt goes first; readers skip locked messages (SKIP LOCKED) and never wait for one.
  -- An attempt whose message was read again since (a later read in the layer's record) holds
  -- nothing, whatever the message's row says now: it is not among those to finish (open).
  select count(*),
         array_agg(l.attempt_id) filter (where l.outcome is not null),
         array_agg(distinct l.queue) filter (where l.open),
         array_agg(distinct l.lease_id) filter (where l.open),
         array_agg(l.msg_id order by l.msg_id, l.read_ct desc) filter (where l.open),
         array_agg(l.read_ct order by l.msg_id, l.read_ct desc) filter (where l.open),
         array_agg(l.enqueued_at order by l.msg_id, l.read_ct desc) filter (where l.open),
         array_agg(l.attempt_id order by l.msg_id, l.read_ct desc) filter (where l.open)
    into v_found, v_finished, v_queues, v_leases, v_msg_ids, v_read_cts, v_enqueued, v_attempts
    from (select l.*, l.outcome is null
                      and not exists (select from pgfence_pgmq.attempts b
                                       where b.queue = l.queue and b.msg_id = l.msg_id
                                         and coalesce(b.read_order, 0) > coalesce(l.read_order, 0)) as open
            from (select a.attempt_id, a.outcome, a.queue, a.lease_id,
                         a.msg_id, a.read_ct, a.enqueued_at, a.read_order
                    from pgfence_pgmq.attempts a
                   where a.attempt_id = any (finish.attempt_ids)
                   order by a.attempt_id
                     for update) l) l;
  perform pgfence.limit_idle();
  if v_found < v_n then
    perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence_pgmq.read',
      (select u.a::text from unnest(finish.attempt_ids) with ordinality u(a, n)
        where not exists (select from pgfence_pgmq.attempts a where a.attempt_id = u.a)
        order by u.n limit 1));
  end if;
  -- Per queue, one statement over all its messages that have no result yet.
  foreach v_queue in array coalesce(v_queues, '{}') loop
    if cardinality(v_queues) > 1 then
      select array_agg(distinct a.lease_id), array_agg(a.msg_id order by a.msg_id, a.read_ct desc),
             array_agg(a.read_ct order by a.msg_id, a.read_ct desc),
             array_agg(a.enqueued_at order by a.msg_id, a.read_ct desc),
             array_agg(a.attempt_id order by a.msg_id, a.read_ct desc)
        into v_leases, v_msg_ids, v_read_cts, v_enqueued, v_attempts
        from pgfence_pgmq.attempts a
       where a.attempt_id = any (finish.attempt_ids) and a.queue = v_queue and a.outcome is null
         and not exists (select from pgfence_pgmq.attempts b
                          where b.queue = a.queue and b.msg_id = a.msg_id
                            and coalesce(b.read_order, 0) > coalesce(a.read_order, 0));
    end if;
    v_table := pgfence_pgmq.queue_table(v_queue);
    -- What pgmq's own archive or delete would need of the caller's role.
    perform pgfence_pgmq.check_allowed(v_table, 'delete', finish.kind = 'archive');
    -- These writes are authorized by the attempts, whose leases may have expired since, so the
    -- guard of a protected queue table is shown their resources for this statement alone.
    v_was := null;
    foreach v_lease in array v_leases loop
      v_mark := pgfence.mark_lease(v_lease, pg_catalog.to_regclass(format('pgmq.%I', v_table)));
      v_was := coalesce(v_was, v_mark);  -- the first: what was there before any of them
    end loop;
    -- The check and the write are one statement. A reader that holds a message's row (read,
    -- not yet committed) is waited for and the count judged on what it committed; a reader that
    -- comes later skips the row (SKIP LOCKED) and then finds it gone. pgmq.archive's own
    -- statement, with the read count added; for one message in the form pgmq.archive plans
    -- fastest (one message per call is the common case of archive).
    if cardinality(v_msg_ids) = 1 and finish.kind = 'archive' then
      execute format(
        'with gone as (delete from pgmq.%I m where %s'
        '              returning m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, m.headers) '
        'insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) '
        'select * from gone returning msg_id',
        v_table, c_holds_one, 'a' || substr(v_table, 2))
        into v_one using v_msg_ids[1], v_read_cts[1], v_enqueued[1];
    elsif cardinality(v_msg_ids) = 1 then
      execute format('delete from pgmq.%I m where %s returning m.msg_id', v_table, c_holds_one)
        into v_one using v_msg_ids[1], v_read_cts[1], v_enqueued[1];
    elsif finish.kind = 'archive' then
      execute format(
        'with gone as (delete from pgmq.%I m where %s'
        '              returning m.msg_id, m.vt, m.read_ct, m.enqueued_at, m.last_read_at, m.message, m.headers), '
        'moved as (insert into pgmq.%I (msg_id, vt, read_ct, enqueued_at, last_read_at, message, headers) '
        '          select * from gone returning msg_id) '
        'select array_agg(msg_id) from moved',
        v_table, c_holds_many, 'a' || substr(v_table, 2))
        into v_done using v_msg_ids, v_read_cts, v_enqueued;
    else
      execute format('with gone as (delete from pgmq.%I m where %s returning m.msg_id) select array_agg(msg_id) from gone',
                     v_table, c_holds_many)
        into v_done using v_msg_ids, v_read_cts, v_enqueued;
    end if;
    if v_was is not null then
      perform set_config('pgfence.fenced', v_was, true);
    end if;
    -- What went is recorded on the attempt that held it.
    if cardinality(v_msg_ids) = 1 then
      if v_one is not null then
        update pgfence_pgmq.attempts a
           set outcome = finish.kind, finished_at = clock_timestamp()
         where a.attempt_id = v_attempts[1];
        v_accepted := v_accepted + 1;
      end if;
    else
      update pgfence_pgmq.attempts a
         set outcome = finish.kind, finished_at = clock_timestamp()
       where a.attempt_id = any (v_attempts) and a.msg_id = any (v_done)
         and a.read_ct = v_read_cts[array_position(v_msg_ids, a.msg_id)];
      get diagnostics v_count = row_count;
      v_accepted := v_accepted + v_count;
    end if;
  end loop;
  perform set_config('lock_timeout', v_lock_wait, true);
  if v_accepted = v_n then
    return array_fill('accepted'::text, array[v_n]);
  end if;
  -- What has no result now was read again since, or is gone (finished by a newer attempt, or
  -- by hand): stale. Each kind of result of a stale attempt is kept once; a retry adds nothing.
  select array_agg(case when u.attempt_id = any (v_finished) then 'duplicate'
                        when a.outcome is not null then 'accepted'
                        else 'stale' end order by u.n)
    into v_outcomes
    from unnest(finish.attempt_ids) with ordinality u(attempt_id, n)
    join pgfence_pgmq.attempts a on a.attempt_id = u.attempt_id;
  if 'stale' = any (v_outcomes) then
    insert into pgfence_pgmq.stale_results (attempt_id, report, kind, queue, msg_id, read_ct)
    select a.attempt_id,
           (select coalesce(max(s.report), 0) + 1 from pgfence_pgmq.stale_results s where s.attempt_id = a.attempt_id),
           finish.kind, a.queue, a.msg_id, a.read_ct
      from pgfence_pgmq.attempts a
     where a.attempt_id = any (finish.attempt_ids) and a.outcome is null
       and not exists (select from pgfence_pgmq.stale_results s
                        where s.attempt_id = a.attempt_id and s.kind = finish.kind);
  end if;
  return v_outcomes;
end
$$;
comment on function pgfence_pgmq.finish(uuid[], text) is
  'archive and archive_many (kind archive), delete and delete_many (kind delete): the outcome of each attempt, in '
  'the order given. Raises 42501, 22023.';

revoke all on function pgfence_pgmq.finish(uuid[], text) from public;
-- archive and delete, inlined into the caller's query, call it as the caller.
grant execute on function pgfence_pgmq.finish(uuid[], text) to pgfence_worker;

commit;

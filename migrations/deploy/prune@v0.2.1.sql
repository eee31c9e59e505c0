-- Deploy pgfence:prune
-- requires: leases
-- requires: invocations
-- requires: tasks
-- requires: attempt_leases
-- requires: stale_reports
-- requires: updates
-- requires: unfenced_writes
-- requires: errors
-- requires: layers

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Where prune finds old rows without reading the live ones: each index holds only rows that
-- have ended, so no hot path reads it; a completion or a lease's end (already an update that
-- changes an indexed state) adds one entry. (Invocations are few once pruned: prune reads
-- them all.)
-- Built inside the upgrade's transaction (CONCURRENTLY cannot be), so writes to the table wait
-- for the build: on a large history, seconds. Upgrade at a quiet moment (docs/upgrading.md).
-- squawk-ignore require-concurrent-index-creation
create index tasks_finished on pgfence.tasks (finished_at) where state in ('completed', 'failed');
-- squawk-ignore require-concurrent-index-creation
create index leases_ended on pgfence.leases (ended_at) where state in ('released', 'superseded');
-- request_start asks for a pending, unexpired invocation of its resource: by resource alone it
-- walked every expired one nobody acknowledged (a supervisor whose starts never arrive), and
-- slowed as they piled up; by resource and expiry it reads only the latest one.
-- squawk-ignore require-concurrent-index-creation
create index invocations_pending_expiry on pgfence.invocations (resource, expires_at)
  where acknowledged_at is null;
-- squawk-ignore require-concurrent-index-deletion
drop index pgfence.invocations_pending;

-- Deletes history older than older_than, in batches of 5000 rows, each batch chosen FOR
-- UPDATE SKIP LOCKED, so it never waits for a worker and a worker never waits for it longer
-- than one batch's delete. At most 100 batches a kind per call (one transaction): a kind that
-- reports 500000 rows has more; call again. Never a row live state needs:
--   tasks          completed or failed (finished_at) before the bound; queued and claimed never;
--   stale_results  of pgfence's own queue (a layer's are in its schema), received before the
--                  bound, of a task no longer queued or claimed (report bounds each attempt's
--                  stale results by counting them);
--   leases         released or superseded before the bound, none that a queued or claimed task
--                  names (its current or an older attempt's lease: stale results are verified
--                  against it), nor one that a registered layer's unfinished work names
--                  (pgfence.layers.leases); active and draining ones never (an expired draining lease has
--                  no end time: it goes when its resource's next lease is granted);
--   invocations    expired before the bound (a pending, unexpired one never);
--   updates        windows finished before the bound, with their items; open ones never;
--   unfenced_writes recorded before the bound.
-- A result reported more than older_than after its task finished then raises 22023 (no such
-- attempt) instead of answering duplicate or stale, and release of a pruned lease PF001: so
-- older_than is at least 1 hour, far beyond any retry of a lost answer.
create function pgfence.prune(older_than interval default '7 days')
returns table (what text, rows bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  c_batch constant int := 5000;
  c_batches constant int := 100;
  v_before timestamptz;
  v_needed uuid[];
  v_n bigint;
  v_layer regproc;
  v_more uuid[];
begin
  if prune.older_than is null or prune.older_than < interval '1 hour'
     or prune.older_than > interval '10 years' then
    perform pgfence.invalid_argument('older_than', 'must be at least 1 hour and at most 10 years',
                                     prune.older_than::text);
  end if;
  v_before := clock_timestamp() - prune.older_than;

  what := 'tasks'; rows := 0;
  for i in 1 .. c_batches loop
    delete from pgfence.tasks t
     where t.task_id = any (array(
             select x.task_id from pgfence.tasks x
              where x.state in ('completed', 'failed') and x.finished_at < v_before
              order by x.finished_at limit c_batch
                for update skip locked));
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;

  what := 'stale_results'; rows := 0;
  for i in 1 .. c_batches loop
    delete from pgfence.stale_results s
     where s.ctid = any (array(
             select x.ctid from pgfence.stale_results x
              where x.received_at < v_before
                and not exists (select from pgfence.tasks t
                                 where t.task_id = x.task_id and t.state in ('queued', 'claimed'))
              limit c_batch
                for update skip locked));
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;

  -- The leases unfinished tasks name, once: a new claim names only a current lease, never one
  -- that ended before the bound. (Through tasks_ready and tasks_visibility.)
  v_needed := array(select distinct l.id
                      from pgfence.tasks t
                     cross join lateral unnest(t.attempt_leases || t.lease_id) l(id)
                     where t.state in ('queued', 'claimed') and l.id is not null);
  -- And those each registered layer's unfinished work names (pgfence.layers.leases).
  for v_layer in select l.leases::regproc from pgfence.layers l order by l.schema_name loop
    execute pg_catalog.format('select array(select * from %s())', v_layer) into v_more;
    v_needed := v_needed || v_more;
  end loop;
  what := 'leases'; rows := 0;
  for i in 1 .. c_batches loop
    delete from pgfence.leases l
     where l.lease_id = any (array(
             select x.lease_id from pgfence.leases x
              where x.state in ('released', 'superseded') and x.ended_at < v_before
                and x.lease_id <> all (v_needed)
              order by x.ended_at limit c_batch
                for update skip locked));
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;

  what := 'invocations'; rows := 0;
  for i in 1 .. c_batches loop
    delete from pgfence.invocations v
     where v.invocation_id = any (array(
             select x.invocation_id from pgfence.invocations x
              where x.expires_at < v_before
              order by x.expires_at limit c_batch
                for update skip locked));
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;

  what := 'updates'; rows := 0;
  with gone as (
    select u.token from pgfence.updates u
     where u.finished_at < v_before
       for update skip locked),
  items as (
    delete from pgfence.update_items i using gone where i.token = gone.token)
  delete from pgfence.updates u using gone where u.token = gone.token;
  get diagnostics rows = row_count;
  return next;

  what := 'unfenced_writes'; rows := 0;
  for i in 1 .. c_batches loop
    delete from pgfence.unfenced_writes w
     where w.id = any (array(
             select x.id from pgfence.unfenced_writes x
              where x.at < v_before
              order by x.id limit c_batch
                for update skip locked));
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;

  -- Each registered layer prunes its own history the same way (pgfence.layers).
  for v_layer in select l.prune::regproc from pgfence.layers l where l.prune is not null
                  order by l.schema_name loop
    return query execute pg_catalog.format('select * from %s($1)', v_layer) using prune.older_than;
  end loop;
end
$$;
comment on function pgfence.prune(interval) is
  'Deletes history older than older_than (at least 1 hour; default 7 days): finished tasks, their stale results, '
  'ended leases no unfinished task names, expired invocations, finished update windows, unfenced-write records. '
  'Batches of 5000, SKIP LOCKED, at most 500000 rows a kind per call. Rows removed per kind.';

revoke all on function pgfence.prune(interval) from public;
grant execute on function pgfence.prune(interval) to pgfence_operator;

commit;

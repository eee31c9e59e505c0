-- Revert pgfence:requeue_expired: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.requeue_expired(max_tasks int default 1000)
returns int
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_count int;
begin
  if requeue_expired.max_tasks is null or requeue_expired.max_tasks not between 1 and 100000 then
    perform pgfence.invalid_argument('max_tasks', 'must be 1 to 100000', requeue_expired.max_tasks::text);
  end if;
  -- SKIP LOCKED lets several sessions run this at once. A row whose visibility was extended
  -- after this statement's snapshot is re-read under the lock and no longer matches.
  with expired as (
    select t.task_id
      from pgfence.tasks t
     where t.state = 'claimed' and t.visible_until < clock_timestamp()
     order by t.visible_until
     limit requeue_expired.max_tasks
       for update skip locked)
  update pgfence.tasks t
     set state = case when t.attempt >= t.max_attempts then 'failed' else 'queued' end,
         ready_at = clock_timestamp(),
         visible_until = null,
         error = case when t.attempt >= t.max_attempts
                      then jsonb_build_object('reason', 'visibility expired', 'attempts', t.attempt)
                      else t.error end,
         finished_at = case when t.attempt >= t.max_attempts then clock_timestamp() end
    from expired
   where t.task_id = expired.task_id;
  get diagnostics v_count = row_count;
  if v_count > 0 then
    perform pgfence.limit_idle();  -- the row stays locked to the transaction's end (limit_idle)
  end if;
  return v_count;
end
$$;
comment on function pgfence.requeue_expired(int) is
  'Tasks whose visibility ran out go back to their queue, or fail for good after max_attempts; returns how many. '
  'Safe to run from several sessions at once; never touches an attempt within its visibility.';

revoke all on function pgfence.requeue_expired(int) from public;
grant execute on function pgfence.requeue_expired(int) to pgfence_worker, pgfence_operator;

commit;

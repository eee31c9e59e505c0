-- Deploy pgfence:enqueue
-- requires: tasks
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create function pgfence.enqueue(queue text, payload jsonb default '{}', max_attempts int default 3)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_task_id bigint;
begin
  perform pgfence.check_name('queue', enqueue.queue);
  perform pgfence.check_not_null('payload', enqueue.payload);
  if enqueue.max_attempts is null or enqueue.max_attempts not between 1 and 1000 then
    perform pgfence.invalid_argument('max_attempts', 'must be 1 to 1000', enqueue.max_attempts::text);
  end if;
  insert into pgfence.tasks as t (queue, payload, state, max_attempts, ready_at)
  values (enqueue.queue, enqueue.payload, 'queued', enqueue.max_attempts, clock_timestamp())
  returning t.task_id into v_task_id;
  return v_task_id;
end
$$;
comment on function pgfence.enqueue(text, jsonb, int) is
  'Adds a task to queue; returns its task_id. Raises 22023 on a bad queue name, NULL payload or max_attempts outside 1..1000.';

revoke all on function pgfence.enqueue(text, jsonb, int) from public;
grant execute on function pgfence.enqueue(text, jsonb, int) to pgfence_worker, pgfence_operator;

commit;

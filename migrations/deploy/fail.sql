-- Deploy pgfence:fail
-- requires: report

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create function pgfence.fail(attempt_id uuid, error jsonb default null)
returns text
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  return pgfence.report(fail.attempt_id, 'fail', fail.error);
end
$$;
comment on function pgfence.fail(uuid, jsonb) is
  'Reports a failed attempt: the task is retried with backoff, or fails for good after max_attempts. '
  'Same acceptance rule and outcomes as complete.';

revoke all on function pgfence.fail(uuid, jsonb) from public;
grant execute on function pgfence.fail(uuid, jsonb) to pgfence_worker;

commit;

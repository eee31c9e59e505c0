-- Deploy pgfence:tasks
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create table pgfence.tasks (
  task_id       bigint generated always as identity primary key,
  queue         text not null,
  payload       jsonb not null,
  state         text not null check (state in ('queued', 'claimed', 'completed', 'failed')),
  max_attempts  int not null,
  attempt       int not null default 0,        -- claims so far; the latest is the current attempt
  lease_id      uuid,                          -- the lease the latest claim was made under
  reported      boolean not null default false, -- the latest attempt has sent its result
  ready_at      timestamptz not null,          -- queued: claimable from
  visible_until timestamptz,                   -- claimed: the attempt holds it until
  result        jsonb,
  error         jsonb,
  enqueued_at   timestamptz not null default clock_timestamp(),
  finished_at   timestamptz
);
comment on table pgfence.tasks is 'The task queue. Not a public interface: use enqueue, claim, complete, fail, extend.';
create index tasks_ready on pgfence.tasks (queue, ready_at) where state = 'queued';
-- Also the list of claimed tasks the views and update_status count per lease: an index on
-- lease_id would be one more entry to write per claimed task, on the hottest path.
create index tasks_visibility on pgfence.tasks (visible_until) where state = 'claimed';

revoke all on table pgfence.tasks from public;

commit;

-- Verify pgfence:tasks
select task_id, queue, payload, state, max_attempts, attempt, lease_id, reported, ready_at,
       visible_until, result, error, enqueued_at, finished_at
  from pgfence.tasks where false;
select 'pgfence.tasks_ready'::regclass, 'pgfence.tasks_visibility'::regclass;

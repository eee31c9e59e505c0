-- Verify pgfence:tasks
select task_id, queue, payload, state, max_attempts, attempt, lease_id, reported, ready_at,
       visible_until, result, error, enqueued_at, finished_at
  from pgfence.tasks where false;
select attempt_id, task_id, attempt, kind, body, received_at from pgfence.stale_results where false;
select 'pgfence.claim(uuid, text, int, interval)'::regprocedure, 'pgfence.complete(uuid, jsonb)'::regprocedure,
       'pgfence.fail(uuid, jsonb)'::regprocedure, 'pgfence.extend(uuid, interval)'::regprocedure,
       'pgfence.requeue_expired(int)'::regprocedure, 'pgfence.enqueue(text, jsonb, int)'::regprocedure;

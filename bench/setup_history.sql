-- Fixtures for the claim-history property (scripts/bench): the claimers' lease, and :history
-- completed tasks in the claimed queue, as complete() leaves them. psql -v history=N
select pgfence.register('bench-claim');
select pgfence.acquire('bench-claim', 'bench', interval '1 day');
update pgfence.leases set lease_id = md5(resource)::uuid;
insert into pgfence.tasks (queue, payload, state, max_attempts, attempt, lease_id, reported, ready_at,
                           result, enqueued_at, finished_at)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'completed', 3, 1, md5('bench-claim')::uuid, true,
       clock_timestamp() - interval '1 day', '{"ok": true}', clock_timestamp() - interval '1 day', clock_timestamp()
  from generate_series(1, :history) g;
vacuum (freeze, analyze) pgfence.tasks, pgfence.leases;

-- A fresh round of the claim-history property: the completed history stays, every other task
-- goes, and :tasks ready tasks are queued behind it; vacuumed. psql -v tasks=N
delete from pgfence.tasks where state <> 'completed';
insert into pgfence.tasks (queue, payload, state, max_attempts, ready_at)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'queued', 3, clock_timestamp()
  from generate_series(1, :tasks) g;
vacuum analyze pgfence.tasks;

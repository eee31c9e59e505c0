-- A fresh queue for a claim round: :tasks ready tasks in pgfence.tasks, vacuumed.
-- psql -v tasks=N -f bench/fill_tasks.sql
truncate pgfence.tasks restart identity;
insert into pgfence.tasks (queue, payload, state, max_attempts, ready_at)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'queued', 3, clock_timestamp()
  from generate_series(1, :tasks) g;
vacuum analyze pgfence.tasks;

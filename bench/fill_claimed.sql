-- A fresh round of completions: :tasks claimed tasks (attempt 1) in pgfence.tasks and the
-- handle each client will present, the attempt_id pgfence minted for it.
-- psql -v tasks=N -f bench/fill_claimed.sql
truncate pgfence.tasks, bench.handles restart identity;
insert into pgfence.tasks (queue, payload, state, max_attempts, attempt, lease_id, reported, ready_at, visible_until)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'claimed', 3, 1, md5('bench-claim')::uuid,
       false, clock_timestamp(), clock_timestamp() + interval '1 day'
  from generate_series(1, :tasks) g;
insert into bench.handles (n, attempt_id)
select t.task_id, pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id) from pgfence.tasks t;
select setval('bench.handles_seq', 1, false) as restarted \gset
vacuum analyze pgfence.tasks, bench.handles;

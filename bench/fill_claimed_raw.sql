-- Baseline of fill_claimed.sql: the same :tasks claimed rows in bench.tasks_raw, and the task
-- id each client will present. psql -v tasks=N -f bench/fill_claimed_raw.sql
truncate bench.tasks_raw, bench.handles_raw restart identity;
insert into bench.tasks_raw (queue, payload, state, max_attempts, attempt, lease_id, reported, ready_at, visible_until)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'claimed', 3, 1, md5('bench-claim')::uuid,
       false, clock_timestamp(), clock_timestamp() + interval '1 day'
  from generate_series(1, :tasks) g;
insert into bench.handles_raw (n, task_id) select t.task_id, t.task_id from bench.tasks_raw t;
select setval('bench.handles_raw_seq', 1, false) as restarted \gset
vacuum analyze bench.tasks_raw, bench.handles_raw;

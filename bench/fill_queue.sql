-- A fresh hand-written queue for a claim round: :tasks ready tasks in bench.queue, vacuumed.
-- psql -v tasks=N -f bench/fill_queue.sql
truncate bench.queue restart identity;
insert into bench.queue (queue, payload, state, ready_at)
select 'bench', jsonb_build_object('job', 'resize', 'n', g), 'queued', clock_timestamp()
  from generate_series(1, :tasks) g;
vacuum analyze bench.queue;

-- pgflow_cycle_raw.sql with pgflow's own visibility rule applied: pgflow's start_tasks states
-- that a started task's message stays hidden for its step's timeout + 2 s (by its
-- set_vt_batch), but computes it in a CTE that nothing references, which PostgreSQL never
-- runs (0.8.1 and 0.14.1 alike). pgfence_pgflow.start_tasks applies it; this is the same work
-- done by pgflow's own function, so that the pair compares the fencing alone.
select msg_id from pgmq.read_with_poll('bench_flow_raw', 3600, 1, 1, 100) \gset
select run_id, step_slug, task_index
  from pgflow.start_tasks('bench_flow_raw', array[:msg_id::bigint], md5('bench-pgflow-raw')::uuid) \gset
select count(*) from pgflow.set_vt_batch('bench_flow_raw', array[:msg_id::bigint],
  array[(select coalesce(s.opt_timeout, f.opt_timeout) + 2 from pgflow.steps s join pgflow.flows f using (flow_slug)
          where s.flow_slug = 'bench_flow_raw' and s.step_slug = :step_slug)]);
select count(*) from pgflow.complete_task(:run_id::uuid, :step_slug::text, :task_index::int, '{"ok": true}'::jsonb);

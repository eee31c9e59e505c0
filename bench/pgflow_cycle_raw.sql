-- Baseline of pgflow_cycle.sql: pgflow's own worker protocol on a flow of the same shape, as
-- @pgflow/core's PgflowSqlClient sends it: read the queue, start_tasks, complete_task.
select msg_id from pgmq.read_with_poll('bench_flow_raw', 3600, 1, 1, 100) \gset
select run_id, step_slug, task_index
  from pgflow.start_tasks('bench_flow_raw', array[:msg_id::bigint], md5('bench-pgflow-raw')::uuid) \gset
select count(*) from pgflow.complete_task(:run_id::uuid, :step_slug::text, :task_index::int, '{"ok": true}'::jsonb);

-- Baseline of complete.sql: a raw UPDATE by id on a copy of the task table, the id looked up
-- the same way as the attempt_id.
update bench.tasks_raw t
   set state = 'completed', result = '{"ok": true}', reported = true, visible_until = null,
       finished_at = clock_timestamp()
 where t.task_id = (select h.task_id from bench.handles_raw h where h.n = (select nextval('bench.handles_raw_seq')));

-- The floor of complete (issue 18): a hand-written attempt-checked update, the result accepted
-- only from the attempt and lease that hold the task, on the copy of the task table.
update bench.tasks_raw t
   set state = 'completed', result = '{"ok": true}', reported = true, visible_until = null,
       finished_at = clock_timestamp()
 where t.task_id = (select h.task_id from bench.handles_raw h where h.n = (select nextval('bench.handles_raw_seq')))
   and t.attempt = 1 and t.lease_id = md5('bench-claim')::uuid and t.state = 'claimed' and not t.reported
returning t.task_id;

-- pgfence: one pgflow task's cycle under the lease all clients share: a fenced read and start
-- (pgfence_pgflow.start_tasks), then its completion by the attempt id (complete_task).
select attempt_id from pgfence_pgflow.start_tasks(md5('bench-pgflow')::uuid, 'bench_flow', 'bench_flow',
                                                  interval '1 hour', 1) \gset
select pgfence_pgflow.complete_task(:attempt_id::uuid, '{"ok": true}'::jsonb);

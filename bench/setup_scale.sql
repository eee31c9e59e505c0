-- Fixtures for the scale property (scripts/bench): a fleet and a history as a large
-- installation keeps them between prunes, written straight into the tables as the functions
-- would leave them. psql -v resources=N -v finished=M
--   :resources resources r000001.., each with a live (active, unexpired) lease; every tenth
--              has two superseded leases before it (takeovers) and, every hundredth, a pending
--              invocation;
--   :finished  finished tasks (5% failed) in 20 queues, claimed under the resources' leases,
--              finished over the last 6 days (within retention: nothing for prune yet);
--   10,000 queued tasks and 1,000 claimed ones in the same queues, 1,000 stale results,
--   1,000 unfenced writes recorded for ten resources; what claim and the finishing
--   statements keep beside them (resource_queues, queue_tallies).
insert into pgfence.resources (resource, enabled)
select format('r%s', lpad(g::text, 6, '0')), true from generate_series(1, :resources) g;

-- Superseded leases first, so that generations rise as takeovers would leave them.
insert into pgfence.leases (lease_id, resource, generation, owner, state, acquired_at, renewed_at,
                            expires_at, ended_at)
select gen_random_uuid(), format('r%s', lpad(g::text, 6, '0')), nextval('pgfence.generation'),
       'bench', 'superseded', clock_timestamp() - interval '3 days', clock_timestamp() - interval '3 days',
       clock_timestamp() - interval '3 days', clock_timestamp() - interval '2 days'
  from generate_series(1, :resources) g, generate_series(1, 2) k
 where g % 10 = 0;
insert into pgfence.leases (lease_id, resource, generation, owner, state, acquired_at, renewed_at,
                            expires_at)
select md5(format('r%s', lpad(g::text, 6, '0')))::uuid, format('r%s', lpad(g::text, 6, '0')),
       nextval('pgfence.generation'), 'bench', 'active', clock_timestamp() - interval '1 hour',
       clock_timestamp(), clock_timestamp() + interval '1 day'
  from generate_series(1, :resources) g;

insert into pgfence.invocations (invocation_id, resource, requested_at, expires_at)
select gen_random_uuid(), format('r%s', lpad(g::text, 6, '0')), clock_timestamp(),
       clock_timestamp() + interval '1 hour'
  from generate_series(1, :resources) g
 where g % 100 = 0;

-- Resource i works queue q(i % 20); its tasks were claimed under its lease.
insert into pgfence.tasks (queue, payload, state, max_attempts, attempt, lease_id, attempt_leases,
                           reported, ready_at, result, error, enqueued_at, finished_at)
select format('q%s', r % 20), jsonb_build_object('n', g),
       case when g % 20 = 0 then 'failed' else 'completed' end, 3, 1, l, array[l], true,
       f - interval '1 second', case when g % 20 <> 0 then '{"ok": true}'::jsonb end,
       case when g % 20 = 0 then '{"error": "boom"}'::jsonb end, f - interval '1 second', f
  from (select g, 1 + g % :resources as r,
               md5(format('r%s', lpad((1 + g % :resources)::text, 6, '0')))::uuid as l,
               clock_timestamp() - (g::float8 / :finished) * interval '6 days' as f
          from generate_series(1, :finished) g) x;
insert into pgfence.tasks (queue, payload, state, max_attempts, ready_at)
select format('q%s', g % 20), jsonb_build_object('n', g), 'queued', 3, clock_timestamp() - interval '1 minute'
  from generate_series(1, 10000) g;
insert into pgfence.tasks (queue, payload, state, max_attempts, attempt, lease_id, attempt_leases,
                           ready_at, visible_until)
select format('q%s', r % 20), jsonb_build_object('n', g), 'claimed', 3, 1, l, array[l],
       clock_timestamp() - interval '1 minute', clock_timestamp() + interval '1 hour'
  from (select g, 1 + g * 97 % :resources as r,
               md5(format('r%s', lpad((1 + g * 97 % :resources)::text, 6, '0')))::uuid as l
          from generate_series(1, 1000) g) x;

-- Stale results of the first finished tasks (their attempt 1, under their resource's lease).
insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, body)
select gen_random_uuid(), t.task_id, 1, 'complete', '{"late": true}'
  from pgfence.tasks t where t.state = 'completed' order by t.task_id limit 1000;

insert into pgfence.unfenced_writes (table_name, resource, operation, mode, transaction_id, role_name,
                                     application_name)
select 'public.orders', format('r%s', lpad((1 + g % 10)::text, 6, '0')), 'INSERT', 'observe',
       pg_current_xact_id(), current_user, 'old-binary'
  from generate_series(1, 1000) g;

-- What claim and the finishing statements keep beside the tasks: each resource's queue, and
-- each queue's tally (exact), folded to one row per queue, and 10,000 rows of single
-- completions since the last fold (a minute at about 170 a second).
insert into pgfence.resource_queues (resource, queue)
select distinct l.resource, t.queue from pgfence.tasks t join pgfence.leases l on l.lease_id = t.lease_id;
insert into pgfence.queue_tallies (queue, completed, failed)
select t.queue, count(*) filter (where t.state = 'completed') - 500, count(*) filter (where t.state = 'failed')
  from pgfence.tasks t where t.state in ('completed', 'failed') group by t.queue;
insert into pgfence.queue_tallies (queue, completed)
select format('q%s', g % 20), 1 from generate_series(1, 10000) g;

vacuum (freeze, analyze) pgfence.resources, pgfence.leases, pgfence.invocations, pgfence.tasks,
  pgfence.stale_results, pgfence.unfenced_writes, pgfence.resource_queues, pgfence.queue_tallies;

-- Fixtures for the dead-history property (scripts/bench): the claimers' lease and :history
-- completed tasks in their queue (setup_history.sql), then resource dead-r with :history rows
-- of each kind of its dead history, as a long-running system without prune leaves them:
-- released leases, and expired invocations nobody acknowledged (a supervisor whose starts
-- never arrived). psql -v history=N
\ir setup_history.sql
select pgfence.register('dead-r');
insert into pgfence.leases (lease_id, resource, generation, owner, state, acquired_at, expires_at, ended_at)
select gen_random_uuid(), 'dead-r', nextval('pgfence.generation'), 'bench', 'released',
       clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days'
  from generate_series(1, :history) g;
insert into pgfence.invocations (invocation_id, resource, requested_at, expires_at)
select gen_random_uuid(), 'dead-r', clock_timestamp() - interval '2 days', clock_timestamp() - interval '2 days'
  from generate_series(1, :history) g;
vacuum (freeze, analyze) pgfence.leases, pgfence.invocations;

-- The demo's story, run by scripts/demo. Each owner's lease_id is its capability; sessions do
-- not matter (each statement here could come over a different pooled connection).
\set ON_ERROR_STOP off
\set SHOW_CONTEXT never
\pset footer off

\echo
\echo '== A resource, and a table whose writes must come from its current owner'
select pgfence.register('billing-worker');
create table invoices (id bigint generated always as identity, amount numeric, generation bigint);
select pgfence.protect('invoices', 'billing-worker');

\echo
\echo '== Owner A acquires a 2-second lease and writes inside a fenced transaction'
select lease_id as a_lease, generation as a_generation
  from pgfence.acquire('billing-worker', 'worker-A', '2 seconds') \gset
\echo 'A holds generation' :a_generation
begin;
select pgfence.fence(:'a_lease') as a_fenced_generation;
insert into invoices (amount, generation) values (100, :a_generation);
commit;

\echo
\echo '== B polls: A is current, so acquire returns NULL and B stays a standby'
select lease_id is null as b_got_nothing from pgfence.acquire('billing-worker', 'worker-B', '30 seconds');

\echo
\echo '== A pauses (a GC stall, SIGSTOP, a partition) for 2.5 seconds: its lease runs out'
select pg_sleep(2.5);
select owner, generation, status from pgfence.lease_status;

\echo
\echo '== B polls again and takes over with the next generation'
select lease_id as b_lease, generation as b_generation
  from pgfence.acquire('billing-worker', 'worker-B', '30 seconds') \gset
\echo 'B holds generation' :b_generation

\echo
\echo '== A wakes up and carries on as if nothing happened. The database refuses it:'
\echo '-- A renews'
select * from pgfence.renew(:'a_lease', '2 seconds');
\echo '-- A writes inside a fenced transaction'
begin;
select pgfence.fence(:'a_lease');
rollback;
\echo '-- A writes without fencing'
insert into invoices (amount, generation) values (666, :a_generation);
\echo '-- A releases (false: it no longer holds anything, and B is untouched)'
select pgfence.release(:'a_lease') as a_released;

\echo
\echo '== B, the current owner, renews, writes and releases'
select state as b_renewed from pgfence.renew(:'b_lease', '30 seconds');
begin;
select pgfence.fence(:'b_lease') as b_fenced_generation;
insert into invoices (amount, generation) values (200, :b_generation);
commit;
select pgfence.release(:'b_lease') as b_released;

\echo
\echo '== What was written, and by which generation'
select id, amount, generation from invoices order by id;

\echo
\echo '== pgfence.resource_status'
select resource, enabled, owner, generation, draining_leases, pending_invocations from pgfence.resource_status;
\echo '== pgfence.lease_status'
select resource, generation, owner, status, acquired_at::time(0), ended_at::time(0) from pgfence.lease_status order by generation;

-- Deploy pgfence:resource_queues
-- requires: tasks
-- requires: leases
-- requires: resources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The queues each resource's leases have claimed from, for pgfence.counters: claim records a
-- pair the first time (a primary-key probe per claim, no write after that). Found from the
-- tasks instead, a resource's queues cost a scan of every task (tasks have no index on
-- lease_id: claims would maintain it). Kept when prune removes the tasks: a resource's queues
-- are few.
create table pgfence.resource_queues (
  resource text not null references pgfence.resources on delete cascade,
  queue    text not null,
  primary key (resource, queue)
);
comment on table pgfence.resource_queues is
  'The queues each resource''s leases have claimed from (written by claim). Not a public interface: read pgfence.counters.';

-- The pairs of the history kept so far (the claims before this change).
insert into pgfence.resource_queues (resource, queue)
select distinct l.resource, t.queue
  from pgfence.tasks t
  join pgfence.leases l on l.lease_id = t.lease_id;

revoke all on table pgfence.resource_queues from public;

commit;

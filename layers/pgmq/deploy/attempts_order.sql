-- Deploy pgfence_pgmq:attempts_order
-- requires: attempts
--
-- 0.3.0: the layer's record of reads in the order they were made, so that an attempt is stale
-- once a later read of its message exists, whatever a producer does to the message since (one
-- that copies msg_id, read_ct and enqueued_at of a stale read into the queue again cannot
-- revive it); the monitors' view of reads asks the core about leases (pgfence.lease_facts)
-- instead of reading pgfence.leases; and the layer's own mark() gives way to the core's
-- pgfence.mark_lease.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Reads numbered as they are made (the next read of a message comes after the one before has
-- been recorded: pgmq's read locks the message row, which the recording read holds to its end).
-- Reads recorded before 0.3.0 have none, and count as older than any read numbered.
create sequence pgfence_pgmq.read_order as bigint;
comment on sequence pgfence_pgmq.read_order is 'The order of reads (pgfence_pgmq.attempts.read_order).';
revoke all on sequence pgfence_pgmq.read_order from public;
alter table pgfence_pgmq.attempts add column read_order bigint;
alter table pgfence_pgmq.attempts alter column read_order set default pg_catalog.nextval('pgfence_pgmq.read_order');
-- Whether a later read of a message exists, for each result: its reads, found by the message.
-- Built inside the upgrade's transaction (CONCURRENTLY cannot be), so reads wait for the build:
-- on a large history, seconds. Upgrade at a quiet moment (docs/upgrading.md).
-- squawk-ignore require-concurrent-index-creation
create index attempts_message on pgfence_pgmq.attempts (queue, msg_id);

create or replace view pgfence_pgmq.reads as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.lease_id) as lease_ref,
       l.resource, a.queue, a.msg_id, a.read_ct, a.enqueued_at, a.read_at, a.outcome, a.finished_at
  from pgfence_pgmq.attempts a
  left join pgfence.lease_facts(array(select distinct x.lease_id from pgfence_pgmq.attempts x)) l
         on l.lease_id = a.lease_id;

-- (dead since the core's mark_lease; nothing calls it)
-- squawk-ignore ban-drop-function
drop function pgfence_pgmq.mark(text, uuid);

commit;

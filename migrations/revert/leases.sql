-- Revert pgfence:leases

begin;

drop function pgfence.deprecate(text);
drop function pgfence.release(uuid);
drop function pgfence.drain(uuid);
drop function pgfence.renew(uuid, interval);
drop function pgfence.acquire(text, text, interval, uuid);
drop function pgfence.resource_not_found(text);
drop function pgfence.lease_not_current(uuid, timestamptz);
drop table pgfence.invocations;
drop table pgfence.leases;
drop type pgfence.lease;
drop sequence pgfence.generation;

commit;

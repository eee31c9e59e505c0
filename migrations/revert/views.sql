-- Revert pgfence:views

begin;

drop view pgfence.queue_status;
drop view pgfence.resource_status;
drop view pgfence.lease_status;

commit;

-- Revert pgfence:views

begin;

drop view pgfence.resource_status;
drop view pgfence.lease_status;

commit;

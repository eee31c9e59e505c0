-- Revert pgfence:resource_status

begin;

drop view pgfence.resource_status;

commit;

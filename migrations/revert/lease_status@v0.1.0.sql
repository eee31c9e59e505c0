-- Revert pgfence:lease_status

begin;

drop view pgfence.lease_status;

commit;

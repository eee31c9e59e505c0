-- Revert pgfence:leases

begin;

drop table pgfence.leases;
drop type pgfence.lease;
drop sequence pgfence.generation;

commit;

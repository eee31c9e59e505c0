-- Revert pgfence:protections

begin;

drop table pgfence.protections;

commit;

-- Revert pgfence:invocations

begin;

drop table pgfence.invocations;

commit;

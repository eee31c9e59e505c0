-- Revert pgfence:attempt_leases

begin;

alter table pgfence.tasks drop column attempt_leases;

commit;

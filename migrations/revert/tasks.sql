-- Revert pgfence:tasks

begin;

drop table pgfence.tasks;

commit;

-- Revert pgfence:prune

begin;

drop function pgfence.prune(interval);
drop index pgfence.invocations_expiry;
drop index pgfence.leases_ended;
drop index pgfence.tasks_finished;

commit;

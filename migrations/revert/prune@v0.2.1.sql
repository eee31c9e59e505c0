-- Revert pgfence:prune

begin;

drop function pgfence.prune(interval);
create index invocations_pending on pgfence.invocations (resource) where acknowledged_at is null;
drop index pgfence.invocations_pending_expiry;
drop index pgfence.leases_ended;
drop index pgfence.tasks_finished;

commit;

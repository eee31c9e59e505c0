-- Revert pgfence:roles
-- Nothing to do: the roles are cluster-wide and other databases may use them. Drop them by
-- hand (`drop role pgfence_worker, pgfence_operator, pgfence_monitor`) once no database does.

begin;

select 1;

commit;

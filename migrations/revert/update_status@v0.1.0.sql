-- Revert pgfence:update_status

begin;

drop function pgfence.update_status(uuid);

commit;

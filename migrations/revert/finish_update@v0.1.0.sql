-- Revert pgfence:finish_update

begin;

drop function pgfence.finish_update(uuid);

commit;

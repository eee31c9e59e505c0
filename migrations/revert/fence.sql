-- Revert pgfence:fence

begin;

drop function pgfence.fence(uuid);

commit;

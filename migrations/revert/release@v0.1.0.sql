-- Revert pgfence:release

begin;

drop function pgfence.release(uuid);

commit;

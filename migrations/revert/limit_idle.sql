-- Revert pgfence:limit_idle

begin;

drop function pgfence.limit_idle();

commit;

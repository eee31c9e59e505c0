-- Revert pgfence:renew

begin;

drop function pgfence.renew(uuid, interval);

commit;

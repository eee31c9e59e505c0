-- Revert pgfence:drain

begin;

drop function pgfence.drain(uuid);

commit;

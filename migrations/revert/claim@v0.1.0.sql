-- Revert pgfence:claim

begin;

drop function pgfence.claim(uuid, text, int, interval);

commit;

-- Revert pgfence:acquire

begin;

drop function pgfence.acquire(text, text, interval, uuid);

commit;

-- Revert pgfence:request_start

begin;

drop function pgfence.request_start(text, interval);

commit;

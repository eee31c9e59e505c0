-- Revert pgfence:lockdown
-- Nothing to undo: revoked privileges were never pgfence's to give.

begin;

select 1;

commit;

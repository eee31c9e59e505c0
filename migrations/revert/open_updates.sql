-- Revert pgfence:open_updates

begin;

drop view pgfence.open_updates;

commit;

-- Revert pgfence:version

begin;

drop function pgfence.version();

commit;

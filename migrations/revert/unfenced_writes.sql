-- Revert pgfence:unfenced_writes

begin;

drop table pgfence.unfenced_writes;

commit;

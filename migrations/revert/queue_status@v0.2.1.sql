-- Revert pgfence:queue_status

begin;

drop view pgfence.queue_status;

commit;

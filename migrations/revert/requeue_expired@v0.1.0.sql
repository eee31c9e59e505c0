-- Revert pgfence:requeue_expired

begin;

drop function pgfence.requeue_expired(int);

commit;

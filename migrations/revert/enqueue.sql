-- Revert pgfence:enqueue

begin;

drop function pgfence.enqueue(text, jsonb, int);

commit;

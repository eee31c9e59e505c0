-- Revert pgfence:complete

begin;

drop function pgfence.complete(uuid, jsonb);

commit;

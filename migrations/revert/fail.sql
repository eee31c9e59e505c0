-- Revert pgfence:fail

begin;

drop function pgfence.fail(uuid, jsonb);

commit;

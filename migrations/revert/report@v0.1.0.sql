-- Revert pgfence:report

begin;

drop function pgfence.report(uuid, text, jsonb);

commit;

-- Revert pgfence:cancel_invocations

begin;

drop function pgfence.cancel_invocations(text);

commit;

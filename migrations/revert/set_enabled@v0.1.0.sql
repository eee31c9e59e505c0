-- Revert pgfence:set_enabled

begin;

drop function pgfence.set_enabled(text, boolean);

commit;

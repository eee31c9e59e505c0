-- Revert pgfence:deprecate

begin;

drop function pgfence.deprecate(text);

commit;

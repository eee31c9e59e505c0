-- Revert pgfence:register

begin;

drop function pgfence.register(text, boolean);

commit;

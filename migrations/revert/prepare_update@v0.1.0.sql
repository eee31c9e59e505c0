-- Revert pgfence:prepare_update

begin;

drop function pgfence.prepare_update(text[], uuid);

commit;

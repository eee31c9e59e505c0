-- Revert pgfence:ref

begin;

drop function pgfence.ref(uuid);

commit;

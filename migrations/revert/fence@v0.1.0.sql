-- Revert pgfence:fence

begin;

drop function pgfence.fence(uuid);
drop function pgfence.fence_token(text, bytea);

commit;

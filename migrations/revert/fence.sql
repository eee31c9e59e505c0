-- Revert pgfence:fence

begin;

drop function pgfence.fence(uuid);
drop function pgfence.fence_token(text, bytea);
drop function pgfence.sign(text, bytea);
drop table pgfence.signing_key;

commit;

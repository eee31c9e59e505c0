-- Revert pgfence:fence

begin;

drop function pgfence.fence(uuid);
drop function pgfence.fence_token(text);
drop function pgfence.sign(text);
drop table pgfence.signing_key;

commit;

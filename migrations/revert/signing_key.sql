-- Revert pgfence:signing_key

begin;

drop function pgfence.sign(text, bytea);
drop table pgfence.signing_key;

commit;

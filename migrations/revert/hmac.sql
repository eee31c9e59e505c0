-- Revert pgfence:hmac

begin;

drop function pgfence.hmac(text, bytea);

commit;

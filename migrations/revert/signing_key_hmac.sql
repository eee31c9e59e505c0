-- Revert pgfence:signing_key_hmac

begin;

alter table pgfence.signing_key drop column hmac_key;

commit;

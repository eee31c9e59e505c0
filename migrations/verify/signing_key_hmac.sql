-- Verify pgfence:signing_key_hmac
select 1 / (length(hmac_key) = 128)::int from pgfence.signing_key;

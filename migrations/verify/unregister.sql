-- Verify pgfence:unregister
select 1/(not pgfence.unregister('verify_none'))::int;

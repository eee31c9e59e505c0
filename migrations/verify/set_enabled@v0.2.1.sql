-- Verify pgfence:set_enabled
select 'pgfence.set_enabled(text, boolean)'::regprocedure;

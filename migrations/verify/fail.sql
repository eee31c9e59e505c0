-- Verify pgfence:fail
select 'pgfence.fail(uuid, jsonb)'::regprocedure;

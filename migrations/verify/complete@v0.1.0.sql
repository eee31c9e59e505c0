-- Verify pgfence:complete
select 'pgfence.complete(uuid, jsonb)'::regprocedure;

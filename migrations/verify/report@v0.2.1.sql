-- Verify pgfence:report
select 'pgfence.report(uuid, text, jsonb)'::regprocedure;

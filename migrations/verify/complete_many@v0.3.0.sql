-- Verify pgfence:complete_many
select 'pgfence.complete_many(uuid[], jsonb[])'::regprocedure;

-- Verify pgfence:complete
select 'pgfence.complete(uuid, jsonb)'::regprocedure,
       'pgfence.attempt_holds(bigint, int, uuid, boolean, bytea, uuid)'::regprocedure;

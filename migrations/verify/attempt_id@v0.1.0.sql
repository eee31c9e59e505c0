-- Verify pgfence:attempt_id
select 'pgfence.attempt_uuid(bigint, int, uuid, bytea)'::regprocedure, 'pgfence.attempt_uuid(bigint, int, uuid)'::regprocedure,
       'pgfence.attempt_task(uuid)'::regprocedure, 'pgfence.attempt_of(uuid)'::regprocedure;

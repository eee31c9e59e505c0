-- Verify pgfence:errors
select 'pgfence.invalid_argument(text, text, text)'::regprocedure, 'pgfence.lease_not_current(uuid, timestamptz)'::regprocedure,
       'pgfence.resource_not_found(text)'::regprocedure, 'pgfence.unknown_attempt(uuid)'::regprocedure,
       'pgfence.update_not_found(uuid)'::regprocedure;

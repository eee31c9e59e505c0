-- Verify pgfence:lease_judgement
select 'pgfence.is_current(text, timestamptz)'::regprocedure, 'pgfence.is_live(text, timestamptz)'::regprocedure,
       'pgfence.hold_current(uuid)'::regprocedure;

-- Verify pgfence:cancel_invocations
select 'pgfence.cancel_invocations(text)'::regprocedure;

-- Verify pgfence:renew
select 'pgfence.renew(uuid, interval)'::regprocedure;

-- Verify pgfence:prune
select 'pgfence.prune(interval)'::regprocedure, 'pgfence.tasks_finished'::regclass,
       'pgfence.leases_ended'::regclass, 'pgfence.invocations_pending_expiry'::regclass;

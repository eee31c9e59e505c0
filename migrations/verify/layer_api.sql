-- Verify pgfence:layer_api
select 'pgfence.hold_fenced(uuid)'::regprocedure, 'pgfence.mark_lease(uuid, regclass)'::regprocedure,
       'pgfence.mark_guards(regclass[])'::regprocedure, 'pgfence.lease_facts(uuid[])'::regprocedure,
       'pgfence.owner_ref(uuid, text)'::regprocedure, 'pgfence.limit_lock_wait()'::regprocedure,
       'pgfence.prune_attempts(regclass, regclass, name, interval, uuid[])'::regprocedure;
select 1 / (select (l.lanname = 'plpgsql')::int from pg_proc p join pg_language l on l.oid = p.prolang
               where p.oid = 'pgfence.mark_lease(uuid, regclass)'::regprocedure);

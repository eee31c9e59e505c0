-- Verify pgfence:kinds
select 1/(obj_description('pgfence.hold_fenced(uuid)'::regprocedure, 'pg_proc') ~ '^Layers:')::int;
select 1/(obj_description('pgfence.mark_lease(uuid, regclass)'::regprocedure, 'pg_proc') ~ '^Layers:')::int;

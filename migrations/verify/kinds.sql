-- Verify pgfence:kinds
select 1/(obj_description('pgfence.hold_current(uuid)'::regprocedure, 'pg_proc') ~ '^Layers:')::int;

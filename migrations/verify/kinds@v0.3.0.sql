-- Verify pgfence:kinds
select 1/(obj_description('pgfence.hold_fenced(uuid)'::regprocedure, 'pg_proc') ~ '^Layers:')::int;

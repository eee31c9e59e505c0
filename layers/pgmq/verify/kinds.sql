-- Verify pgfence_pgmq:kinds
select 1/(obj_description('pgfence_pgmq.health()'::regprocedure, 'pg_proc') ~ '^Hook:')::int;

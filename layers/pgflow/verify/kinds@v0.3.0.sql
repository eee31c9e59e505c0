-- Verify pgfence_pgflow:kinds
select 1/(obj_description('pgfence_pgflow.health()'::regprocedure, 'pg_proc') ~ '^Hook:')::int;

-- Verify pgfence:releases
select 'pgfence.seal(name, text)'::regprocedure, 'pgfence.check_release(name, text, text)'::regprocedure,
       'pgfence.schema_drift(name)'::regprocedure;
select 1 / (count(*) > 0)::int from pgfence.schema_objects('pgfence');
select 1 / (to_regclass('pgfence.manifest') is null)::int;

-- Verify pgfence:register
select 1/(not has_function_privilege('pgfence_worker', 'pgfence.register(text, boolean)', 'execute'))::int;

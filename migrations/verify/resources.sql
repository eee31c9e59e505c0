-- Verify pgfence:resources
select resource, enabled, enabled_version, registered_at from pgfence.resources where false;
select 'pgfence.register(text, boolean)'::regprocedure, 'pgfence.set_enabled(text, boolean)'::regprocedure;

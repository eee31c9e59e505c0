-- Verify pgfence:resources
select resource, enabled, enabled_version, registered_at from pgfence.resources where false;

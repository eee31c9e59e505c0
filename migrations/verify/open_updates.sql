-- Verify pgfence:open_updates
select token, resources, prepared_at from pgfence.open_updates where false;

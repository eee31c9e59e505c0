-- Verify pgfence:layers
select schema_name, in_flight, leases, prune, health from pgfence.layers where false;

-- Verify pgfence:layers
select schema_name, in_flight, prune, health from pgfence.layers where false;

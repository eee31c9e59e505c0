-- Verify pgfence:resource_queues
select resource, queue from pgfence.resource_queues where false;

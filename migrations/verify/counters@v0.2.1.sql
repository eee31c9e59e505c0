-- Verify pgfence:counters
select resource, enabled, generation, lease_state, lease_age, takeovers, stale_results,
       unfenced_writes, queues, queue_depth, oldest_ready_age
  from pgfence.counters where false;

-- Verify pgfence:updates
select token, request_id, resources, prepared_at, finished_at from pgfence.updates where false;
select token, resource, saved_enabled, enabled_version, drained_generation, pending_invocations, outcome
  from pgfence.update_items where false;
select 'pgfence.update_items_one_open'::regclass;

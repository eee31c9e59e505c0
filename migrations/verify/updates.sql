-- Verify pgfence:updates
select token, request_id, resources, prepared_at, finished_at from pgfence.updates where false;
select token, resource, saved_enabled, enabled_version, drained_generation, pending_invocations, outcome
  from pgfence.update_items where false;
select token, resources, prepared_at from pgfence.open_updates where false;
select 'pgfence.prepare_update(text[], uuid)'::regprocedure, 'pgfence.update_status(uuid)'::regprocedure,
       'pgfence.finish_update(uuid)'::regprocedure;

-- Verify pgfence:layer_hooks
select enabled_changed, window_prepare, window_status, window_finish from pgfence.layers where false;
select 'pgfence.enabled_changed(text[])'::regprocedure;
select 'pgfence.layer_work()'::regprocedure;
select 'pgfence.layer_window(uuid, text[])'::regprocedure;

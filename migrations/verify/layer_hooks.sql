-- Verify pgfence:layer_hooks
select enabled_changed, window_prepare, window_status, window_finish from pgfence.layers where false;
-- No reg* column left (pg_upgrade keeps no OIDs): every function named as text.
select 1/(not exists (select from pg_attribute a
                       where a.attrelid = 'pgfence.layers'::regclass and a.attnum > 0 and not a.attisdropped
                         and a.atttypid <> 'text'::regtype and a.attname <> 'schema_name'))::int;
select 'pgfence.enabled_changed(text[])'::regprocedure;
select 'pgfence.layer_work()'::regprocedure;
select 'pgfence.layer_window(uuid, text[])'::regprocedure;

-- Revert pgfence:layer_hooks

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.layer_window(uuid, text[]);
drop function pgfence.layer_work();
drop function pgfence.enabled_changed(text[]);
alter table pgfence.layers
  drop column enabled_changed,
  drop column window_prepare,
  drop column window_status,
  drop column window_finish,
  alter column in_flight type regprocedure using in_flight::regprocedure,
  alter column leases type regprocedure using leases::regprocedure,
  alter column prune type regprocedure using prune::regprocedure,
  alter column health type regprocedure using health::regprocedure;
comment on table pgfence.layers is
  'The optional layers installed, each with its in_flight, leases, prune and health functions. Written by layer installs.';

commit;

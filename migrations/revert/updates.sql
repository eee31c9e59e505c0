-- Revert pgfence:updates

begin;

drop view pgfence.open_updates;
drop function pgfence.finish_update(uuid);
drop function pgfence.update_status(uuid);
drop function pgfence.update_not_found(uuid);
drop function pgfence.prepare_update(text[], uuid);
drop table pgfence.update_items;
drop table pgfence.updates;

commit;

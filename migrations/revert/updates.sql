-- Revert pgfence:updates

begin;

drop table pgfence.update_items;
drop table pgfence.updates;

commit;

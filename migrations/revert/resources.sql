-- Revert pgfence:resources

begin;

drop function pgfence.set_enabled(text, boolean);
drop function pgfence.register(text, boolean);
drop table pgfence.resources;

commit;

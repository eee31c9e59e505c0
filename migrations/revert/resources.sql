-- Revert pgfence:resources

begin;

drop table pgfence.resources;

commit;

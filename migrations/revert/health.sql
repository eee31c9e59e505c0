-- Revert pgfence:health

begin;

drop function pgfence.health();
drop table pgfence.manifest;
drop function pgfence.schema_objects();

commit;

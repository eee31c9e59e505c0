-- Revert pgfence:health

begin;

drop function pgfence.health();
drop function pgfence.health_checks();
drop table pgfence.manifest;
drop function pgfence.schema_objects();

commit;

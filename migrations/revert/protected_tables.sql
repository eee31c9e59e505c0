-- Revert pgfence:protected_tables

begin;

drop view pgfence.protected_tables;

commit;

-- Revert pgfence:counters

begin;

drop view pgfence.counters;

commit;

-- Revert pgfence:stale_results

begin;

drop table pgfence.stale_results;

commit;

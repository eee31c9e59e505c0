-- Revert pgfence:stale_reports

begin;

drop index pgfence.stale_results_task_attempt;
delete from pgfence.stale_results where report > 1;
alter table pgfence.stale_results drop constraint stale_results_pkey;
revoke select (task_id, attempt, kind, body, received_at, report) on table pgfence.stale_results
  from pgfence_monitor, pgfence_operator;
grant select on table pgfence.stale_results to pgfence_monitor, pgfence_operator;
alter table pgfence.stale_results drop column report;
alter table pgfence.stale_results add constraint stale_results_pkey primary key (attempt_id);

commit;

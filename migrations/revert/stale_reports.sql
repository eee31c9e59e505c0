-- Revert pgfence:stale_reports

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';
lock table pgfence.stale_results in share mode;
-- Refused while it would delete records: release 0.1.0 keeps one record per stale attempt;
-- the later reports of one (report > 1) have no place there.
do $refuse$
declare
  v_rows bigint;
begin
  select pg_catalog.count(*) into v_rows from pgfence.stale_results s where s.report operator(pg_catalog.>) 1;
  if v_rows operator(pg_catalog.>) 0 then
    raise exception 'pgfence: revert of stale_reports refused: it would delete % stale-result '
                    'record(s) (later reports of one stale attempt, report > 1)', v_rows
      using errcode = '55000',
            hint = 'copy them elsewhere and delete them (delete from pgfence.stale_results '
                   'where report > 1), then revert again; sqitch deploy restores what was '
                   'reverted before this step';
  end if;
end
$refuse$;

drop index pgfence.stale_results_task_attempt;
alter table pgfence.stale_results drop constraint stale_results_pkey;
revoke select (task_id, attempt, kind, body, received_at, report) on table pgfence.stale_results
  from pgfence_monitor, pgfence_operator;
grant select on table pgfence.stale_results to pgfence_monitor, pgfence_operator;
alter table pgfence.stale_results drop column report;
alter table pgfence.stale_results add constraint stale_results_pkey primary key (attempt_id);

commit;

-- Revert pgfence:stale_sources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';
lock table pgfence.stale_results in share mode;
-- Refused while it would delete records: release 0.1.0 has no stale results of pgmq
-- messages (pgmq_queue).
do $refuse$
declare
  v_rows bigint;
begin
  select pg_catalog.count(*) into v_rows from pgfence.stale_results s where s.pgmq_queue is not null;
  if v_rows operator(pg_catalog.>) 0 then
    raise exception 'pgfence: revert of stale_sources refused: it would delete % stale-result '
                    'record(s) of pgmq messages (pgmq_queue)', v_rows
      using errcode = '55000',
            hint = 'copy them elsewhere and delete them (delete from pgfence.stale_results '
                   'where pgmq_queue is not null), then revert again; sqitch deploy restores what was '
                   'reverted before this step';
  end if;
end
$refuse$;

alter table pgfence.stale_results drop constraint stale_results_source_check;
alter table pgfence.stale_results drop constraint stale_results_kind_check;
alter table pgfence.stale_results add constraint stale_results_kind_check check (kind in ('complete', 'fail'));
alter table pgfence.stale_results drop column pgmq_queue;

commit;

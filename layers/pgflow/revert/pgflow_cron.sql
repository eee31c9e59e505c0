-- Revert pgfence_pgflow:pgflow_cron
--
-- pgflow's jobs get back what setup_cron recorded (undo_cron: a job still calling the layer gets
-- its own command again; a job changed since is left as it is), so that no job is left calling
-- a function the layer's revert drops. A revert to 0.2.1 leaves them so too: run 0.2.1's
-- setup_cron there to point them at the layer again. The caller must be allowed to alter the
-- jobs (their owner, or a superuser), or the revert fails and changes nothing.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence_pgflow.undo_cron(); end $$;

drop function pgfence_pgflow.undo_cron();
drop function pgfence_pgflow.setup_cron();

-- 0.2.1's, of the change pgflow_workers.
create function pgfence_pgflow.setup_cron()
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_n int := 0;
begin
  if pg_catalog.to_regnamespace('cron') is null then
    return 'pg_cron is not installed: nothing to do';
  end if;
  execute 'select count(cron.alter_job(j.jobid, command => c.command))
             from cron.job j join (values (''pgflow_ensure_workers'', ''select pgfence_pgflow.ensure_workers()''),
                                          (''pgflow_requeue_stalled_tasks'', ''select pgfence_pgflow.requeue_stalled_tasks()''))
                                  c(jobname, command) on c.jobname = j.jobname'
    into v_n;
  return format('%s pgflow cron jobs now call pgfence_pgflow', v_n);
end
$$;
comment on function pgfence_pgflow.setup_cron() is
  'Operator, once after installing the layer on pgflow 0.14: pgflow''s cron jobs pgflow_ensure_workers and '
  'pgflow_requeue_stalled_tasks call pgfence_pgflow.ensure_workers() and requeue_stalled_tasks() instead.';
revoke all on function pgfence_pgflow.setup_cron() from public;
grant execute on function pgfence_pgflow.setup_cron() to pgfence_operator;

drop function pgfence_pgflow.cron_commands();
drop table pgfence_pgflow.cron_jobs;

commit;

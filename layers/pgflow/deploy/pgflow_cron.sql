-- Deploy pgfence_pgflow:pgflow_cron
-- requires: pgflow_workers
--
-- 0.3.0: pgflow's cron jobs with an exact-state contract. setup_cron (0.2's, in pgflow_workers)
-- pointed pgflow's two jobs at the layer and kept no record of what they were, so nothing
-- could restore them, and reverting the layer left them calling dropped functions. Now
-- setup_cron records what it changes, undo_cron and the layer's revert put it back exactly
-- (a job that was absent stays absent, one that was paused stays paused: only the command is
-- ever changed), and a missing job is reported. The layer's jobs serve every worker function,
-- fenced or not (pgfence_pgflow.ensure_workers and requeue_stalled_tasks apply pgflow's own
-- rules to the others), so that pgflow's own jobs can call them.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- What setup_cron changed: each of pgflow's jobs it pointed at the layer, with the command it
-- had (the only thing it changes), until undo_cron or the layer's revert puts it back.
create table pgfence_pgflow.cron_jobs (
  jobname   text primary key,
  jobid     bigint not null,
  command   text not null,
  set_at    timestamptz not null default clock_timestamp()
);
comment on table pgfence_pgflow.cron_jobs is
  'pgflow''s cron jobs that setup_cron pointed at the layer, and the command each had before. Not a public interface.';
revoke all on table pgfence_pgflow.cron_jobs from public;

-- pgflow's two jobs, by the names pgflow's migrations schedule them under, with pgflow's own
-- command and the layer's.
create function pgfence_pgflow.cron_commands()
returns table (jobname text, pgflow_command text, layer_command text)
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  values ('pgflow_ensure_workers', 'select pgflow.ensure_workers()', 'select pgfence_pgflow.ensure_workers()'),
         ('pgflow_requeue_stalled_tasks', 'select pgflow.requeue_stalled_tasks()',
          'select pgfence_pgflow.requeue_stalled_tasks()');
$$;
revoke all on function pgfence_pgflow.cron_commands() from public;

-- Points pgflow's jobs at the layer (pg_cron's cron.alter_job, command only: schedule, database,
-- role and active stay as they are) and records each command it replaces. It runs as its
-- caller, who must be allowed to alter the jobs (pg_cron lets a job's owner or a superuser:
-- on Supabase the role that installed pgflow and the layer, postgres) and owns the layer (its
-- record). A missing job is reported (missing) and not made; a job already pointed is left
-- (already). Idempotent.
-- (0.2's returned a sentence: its result changes. A fresh install has none.)
set local client_min_messages = warning;
-- (0.2's setup_cron returned a sentence; nothing in the schema calls it)
-- squawk-ignore ban-drop-function
drop function if exists pgfence_pgflow.setup_cron();
create function pgfence_pgflow.setup_cron()
returns table (jobname text, outcome text, command text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_job record;
  v_id bigint;
  v_command text;
begin
  if pg_catalog.to_regclass('cron.job') is null then
    jobname := null; outcome := 'pg_cron is not installed: nothing to do'; command := null;
    return next;
    return;
  end if;
  for v_job in select c.* from pgfence_pgflow.cron_commands() c order by c.jobname loop
    execute 'select j.jobid, j.command from cron.job j where j.jobname = $1 and j.database = current_database()'
      into v_id, v_command using v_job.jobname;
    jobname := v_job.jobname;
    if v_id is null then
      outcome := 'missing'; command := null;
    elsif v_command = v_job.layer_command then
      outcome := 'already'; command := v_command;
    else
      insert into pgfence_pgflow.cron_jobs (jobname, jobid, command) values (v_job.jobname, v_id, v_command)
      on conflict on constraint cron_jobs_pkey do update set jobid = excluded.jobid, command = excluded.command,
                                                              set_at = excluded.set_at;
      execute 'select cron.alter_job($1, command => $2)' using v_id, v_job.layer_command;
      outcome := 'pointed'; command := v_job.layer_command;
    end if;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.setup_cron() is
  'The jobs'' owner, once after installing the layer on pgflow 0.14: pgflow''s cron jobs pgflow_ensure_workers and '
  'pgflow_requeue_stalled_tasks call pgfence_pgflow.ensure_workers() and requeue_stalled_tasks() instead; each '
  'command replaced is recorded for undo_cron. One row per job: pointed, already, or missing (reported, not made).';

-- Puts back what setup_cron recorded: each job whose command is still the layer's gets its own
-- again (restored); one that is gone stays gone (missing); one whose command someone changed
-- since is left as it is (changed). The record is then forgotten. Runs as its caller, as
-- setup_cron.
create function pgfence_pgflow.undo_cron()
returns table (jobname text, outcome text, command text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_job record;
  v_now text;
begin
  for v_job in select r.jobname, r.jobid, r.command, c.layer_command
                 from pgfence_pgflow.cron_jobs r join pgfence_pgflow.cron_commands() c on c.jobname = r.jobname
                order by r.jobname loop
    v_now := null;
    if pg_catalog.to_regclass('cron.job') is not null then
      execute 'select j.command from cron.job j where j.jobid = $1' into v_now using v_job.jobid;
    end if;
    jobname := v_job.jobname;
    if v_now is null then
      outcome := 'missing'; command := null;
    elsif v_now <> v_job.layer_command then
      outcome := 'changed'; command := v_now;
    else
      execute 'select cron.alter_job($1, command => $2)' using v_job.jobid, v_job.command;
      outcome := 'restored'; command := v_job.command;
    end if;
    delete from pgfence_pgflow.cron_jobs r where r.jobname = v_job.jobname;
    return next;
  end loop;
end
$$;
comment on function pgfence_pgflow.undo_cron() is
  'Undoes setup_cron exactly: each recorded job whose command is still the layer''s gets its own back (restored); '
  'one that is gone stays gone (missing); one changed since is left (changed).';

-- Over 0.2, whose setup_cron kept no record: a job it pointed at the layer had pgflow's own
-- command before (setup_cron pointed only pgflow's two jobs, by name), recorded as such.
do $$
begin
  if pg_catalog.to_regclass('cron.job') is not null then
    execute 'insert into pgfence_pgflow.cron_jobs (jobname, jobid, command)
             select j.jobname, j.jobid, c.pgflow_command
               from cron.job j join pgfence_pgflow.cron_commands() c on c.jobname = j.jobname
              where j.database = current_database() and j.command = c.layer_command';
  end if;
end
$$;

revoke all on function pgfence_pgflow.setup_cron(), pgfence_pgflow.undo_cron() from public;

commit;

-- TEST-ONLY STAND-IN for pg_cron's cron.schedule, never deployed anywhere else.
--
-- Supabase has pg_cron; the test clusters do not (it needs shared_preload_libraries). The
-- quick-start test installs this instead: a cron schema whose schedule records each job in
-- cron.job, by name, as pg_cron 1.3+ does (scheduling a name again replaces its job), with
-- the role that scheduled it (pg_cron runs the job as that role), in this database, active,
-- pg_cron's columns that pgfence's checks read. Nothing ever runs a job.
create schema if not exists cron;

create table cron.job (
  jobid    bigint generated always as identity primary key,
  jobname  text unique,
  schedule text not null,
  command  text not null,
  database text not null default current_database(),
  username text not null default current_user,
  active   boolean not null default true
);
comment on table cron.job is 'TEST-ONLY: the jobs of the cron.schedule stand-in.';

create function cron.schedule(job_name text, schedule text, command text)
returns bigint
language sql
as $$
  insert into cron.job (jobname, schedule, command) values (job_name, schedule, command)
  on conflict (jobname) do update set schedule = excluded.schedule, command = excluded.command,
                                      username = excluded.username
  returning jobid;
$$;
comment on function cron.schedule(text, text, text) is
  'TEST-ONLY stand-in for pg_cron''s cron.schedule(job_name, schedule, command): records the job.';

grant usage on schema cron to public;
grant select, insert, update on cron.job to public;

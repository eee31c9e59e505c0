-- Deploy pgfence:health
-- requires: releases
-- requires: lockdown
--
-- health() checks the core and every layer against the one record of what their releases
-- installed (pgfence.schema_records, written by pgfence.seal), and every privilege that
-- lockdown revokes (pgfence.foreign_grants), in the core's schema and every layer's; the
-- requeue job for real (it exists, is active, runs in this database as a role that may run
-- it, and calls it: pgfence.cron_job_problem, which the layers' checks share); a start pending
-- too long.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- 0.2.1's digest of the core's schema; pgfence.schema_objects(schema) is the record's now.
-- (sql/pgfence.sql never made it.)
do $$
begin
  if pg_catalog.to_regprocedure('pgfence.schema_objects()') is not null then
    drop function pgfence.schema_objects();
  end if;
end
$$;

-- Whether a pg_cron job runs fn for real, and if not, why: NULL when an active job, in this
-- database, as a role that may execute fn (and use its schema), has exactly `select fn()` (an
-- integer argument at most) as its command; otherwise what is wrong with each job whose
-- command names fn, or that none does. A command that merely mentions the name (a comment, a
-- string, another function around it) is no call of it.
create or replace function pgfence.cron_job_problem(fn regprocedure)
returns text
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_jobs regclass := to_regclass('cron.job');
  v_name text;
  v_schema oid;
  v_good boolean;
  v_bad text;
begin
  select format('%I.%I', n.nspname, p.proname), n.oid into v_name, v_schema
    from pg_proc p join pg_namespace n on n.oid = p.pronamespace where p.oid = cron_job_problem.fn;
  if v_jobs is null then
    return format('pg_cron is not installed: schedule %s()', v_name);
  end if;
  execute format($q$
    select coalesce(bool_or(x.problem is null), false),
           string_agg(format('job %%s (%%s): %%s', x.jobid, coalesce(x.jobname, 'no name'), x.problem), '; '
                      order by x.jobid) filter (where x.problem is not null)
      from (select j.jobid, to_jsonb(j)->>'jobname' as jobname,
                   case when j.command !~* ('^\s*select\s+' || regexp_replace($1, '([.$])', '\\\1', 'g')
                                            || '\s*\(\s*([0-9]+)?\s*\)\s*;?\s*$')
                          then format('its command %%L is not a call of %%s', j.command, $1)
                        when not j.active then 'paused (active is false)'
                        when j.database is distinct from current_database()
                          then format('it runs in database %%s, not %%s', j.database, current_database())
                        when not exists (select from pg_roles r where r.rolname = j.username)
                          then format('it runs as %%s, which does not exist', j.username)
                        when not (has_schema_privilege(j.username, $2, 'usage')
                                  and has_function_privilege(j.username, $3, 'execute'))
                          then format('it runs as %%s, which may not execute %%s', j.username, $1)
                   end as problem
              from %s j
             where strpos(lower(j.command), lower($1)) > 0) x$q$, v_jobs)
    into v_good, v_bad using v_name, v_schema, cron_job_problem.fn;
  if v_good then
    return null;
  end if;
  return coalesce(v_bad, format('no pg_cron job calls %s', v_name));
end
$$;
comment on function pgfence.cron_job_problem(regprocedure) is
  'NULL when an active pg_cron job in this database runs select fn() as a role that may; otherwise why not.';

-- The checks of health(), below (a reserved word, "check", is its column's name by contract,
-- but is kept out of PL/pgSQL).
create or replace function pgfence.health_checks()
returns table (name text, ok boolean, detail text)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bad text;
  v_acl text[];
  v_acls text[] := '{}'::text[];
  v_layer regproc;
  v_schema name;
  v_old timestamptz;
  v_release text;
begin
  -- Schema as installed, the core's and each layer's: nothing changed, added or removed by
  -- hand since its release's record (functions, relations, columns, constraints, indexes,
  -- views, triggers, policies, types, owners, every ACL).
  -- Each schema's drift is computed once (it digests the whole schema): its ACL rows are kept
  -- for "roles and grants", below.
  for v_schema in select 'pgfence'::name union all
                  (select l.schema_name from pgfence.layers l order by l.schema_name) loop
    name := case v_schema when 'pgfence' then '' else v_schema || ': ' end || 'schema matches its release';
    select string_agg(case when d.object = 'record' then
                             format('no record of its release (%s predates 0.3.0: upgrade it)', v_schema)
                           else format('%s %s', d.object, d.how) end, '; ' order by d.object)
             filter (where d.object not like 'acl %'),
           array_agg(format('grants on %s %s', substr(d.object, 5),
                            case d.how when 'changed' then 'differ from the release''s' else d.how end))
             filter (where d.object like 'acl %')
      into v_bad, v_acl
      from pgfence.schema_drift(v_schema) d;
    v_acls := v_acls || v_acl;
    ok := v_bad is null;
    v_release := pgfence.installed_release(v_schema);
    detail := coalesce(v_bad, format('%s %s, %s objects as recorded', v_schema, v_release,
                                     (select count(*) from pgfence.schema_records r
                                       where r.schema_name = v_schema and r.release = v_release)));
    return next;
  end loop;

  -- Roles and grants: the three roles exist; nobody but the owners and the three roles holds
  -- a privilege on the core's schema, a layer's, or anything in them (lockdown's rule,
  -- pgfence.foreign_grants: functions, relations, columns, types, schemas); and every ACL
  -- there is as the release granted it (the record's 'acl' rows: a grant to one of the three
  -- roles that the release did not make is named too).
  name := 'roles and grants';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('role %s is missing', r) as x
      from unnest(array['pgfence_worker', 'pgfence_operator', 'pgfence_monitor']) r
     where not exists (select from pg_roles where rolname = r)
    union all
    select format('%s may %s %s', g.grantee, g.privilege, g.object)
      from (select 'pgfence'::name as s union all select l.schema_name from pgfence.layers l) x,
           pgfence.foreign_grants(x.s) g
    union all
    select unnest(v_acls)) y;
  ok := v_bad is null;
  detail := coalesce(v_bad, 'pgfence_worker, pgfence_operator, pgfence_monitor; nothing for PUBLIC');
  return next;

  -- The three roles are cluster-wide: a login role granted pgfence_worker here may connect to
  -- every other database that lets it, and claim there if pgfence is installed there too
  -- (docs/deployment.md: REVOKE CONNECT). Superusers are left out: they may do anything.
  name := 'roles confined to this database';
  select string_agg(format('%s may connect to database %s', m.rolname, d.datname), '; '
                    order by m.rolname, d.datname) into v_bad
    from pg_roles m
    cross join pg_database d
   where not m.rolsuper and m.rolcanlogin
     and (pg_has_role(m.oid, 'pgfence_worker', 'member') or pg_has_role(m.oid, 'pgfence_operator', 'member'))
     and d.datname <> current_database() and d.datallowconn and not d.datistemplate
     and has_database_privilege(m.oid, d.oid, 'connect');
  ok := v_bad is null;
  detail := coalesce(v_bad, 'no login role of pgfence_worker or pgfence_operator may connect elsewhere');
  return next;

  name := 'protections guard every write';
  select string_agg(format('%s: %s', t.table_name, t.problem), '; ' order by t.table_name) into v_bad
    from pgfence.protected_tables t where not t.healthy;
  ok := v_bad is null;
  detail := coalesce(v_bad, format('%s protected tables', (select count(*) from pgfence.protections)));
  return next;

  -- requeue_expired on a schedule (pg_cron): without it a queue whose workers all died keeps
  -- its claimed tasks for ever. A job that runs it for real (pgfence.cron_job_problem).
  name := 'requeue job scheduled';
  v_bad := pgfence.cron_job_problem('pgfence.requeue_expired(int)');
  ok := v_bad is null;
  detail := coalesce(v_bad || ' (docs/supabase.md)', 'a pg_cron job runs pgfence.requeue_expired()');
  return next;

  -- Overdue: a resource left without a live owner, or a task its worker no longer holds
  -- that nothing requeued, for over a minute.
  -- (A lease's expiry has no index: renewals stay HOT. The active leases are one per resource.)
  name := 'no lease or task overdue';
  v_old := clock_timestamp() - interval '1 minute';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('resource %s: its lease (generation %s) expired at %s and nobody took over',
                  l.resource, l.generation, l.expires_at) as x
      from pgfence.leases l join pgfence.resources r using (resource)
     where l.state = 'active' and r.enabled and l.expires_at < v_old
    union all
    select format('queue %s: %s claimed tasks past their visibility, the oldest since %s',
                  t.queue, count(*), min(t.visible_until))
      from pgfence.tasks t
     where t.state = 'claimed' and t.visible_until < v_old
     group by t.queue) y;
  ok := v_bad is null;
  detail := coalesce(v_bad, 'none');
  return next;

  -- A start pending (requested, not acknowledged, not expired) past the time a start takes (a
  -- minute, request_start's default): nothing else starts the resource meanwhile.
  name := 'no start pending too long';
  select string_agg(format('resource %s: a start requested at %s is pending until %s', i.resource,
                           i.requested_at, i.expires_at), '; ' order by i.resource, i.requested_at) into v_bad
    from pgfence.invocations i
   where i.acknowledged_at is null and i.expires_at > clock_timestamp()
     and i.requested_at < clock_timestamp() - interval '1 minute';
  ok := v_bad is null;
  detail := coalesce(v_bad || ': cancel it if nothing will start (pgfence.cancel_invocations)',
                     'none pending for over a minute');
  return next;

  name := 'no update window left open';
  select string_agg(format('window over %s open since %s', array_to_string(u.resources, ', '), u.prepared_at),
                    '; ' order by u.prepared_at) into v_bad
    from pgfence.updates u
   where u.finished_at is null and u.prepared_at < clock_timestamp() - interval '1 hour';
  ok := v_bad is null;
  detail := coalesce(v_bad, 'none open for over an hour');
  return next;

  -- Twice prune's default bound: older history means no prune runs. The bound is a value, not
  -- the clock in the condition, so that it is a range of prune's indexes (tasks_finished,
  -- leases_ended) instead of a filter over all of them; and each kind is counted up to 10,001
  -- rows, read in the index's order (a bitmap scan would read every match before the limit),
  -- so a history that no prune ever cut costs no more than that to report.
  name := 'history within retention';
  v_old := clock_timestamp() - interval '14 days';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('%s finished tasks older than 14 days', case when count(*) > 10000 then 'over 10000' else count(*)::text end) as x
      from (select from pgfence.tasks t
             where t.state in ('completed', 'failed') and t.finished_at < v_old
             order by t.finished_at limit 10001) t
    having count(*) > 0
    union all
    select format('%s ended leases older than 14 days', case when count(*) > 10000 then 'over 10000' else count(*)::text end)
      from (select from pgfence.leases l
             where l.state in ('released', 'superseded') and l.ended_at < v_old
             order by l.ended_at limit 10001) l
    having count(*) > 0
    union all
    select format('%s invocations expired over 14 days ago', case when count(*) > 10000 then 'over 10000' else count(*)::text end)
      from (select from pgfence.invocations i where i.expires_at < v_old limit 10001) i
    having count(*) > 0) y;
  ok := v_bad is null;
  detail := coalesce(v_bad || ': schedule pgfence.prune() (docs/operations.md)', 'nothing older than 14 days');
  return next;

  -- Each registered layer's own checks (pgfence.layers: the core names no layer).
  for v_layer in select l.health::regprocedure::oid::regproc from pgfence.layers l where l.health is not null
                  order by l.schema_name loop
    return query execute pg_catalog.format('select * from %s()', v_layer);
  end loop;
end
$$;
comment on function pgfence.health_checks() is
  'The checks pgfence.health() returns (as name, ok, detail).';

-- The health of an installation, one row per check; ok false names what is wrong, never a
-- capability. Read-only; the monitor may run it (pgfence doctor does).
create or replace function pgfence.health()
returns table ("check" text, ok boolean, detail text)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select c.name, c.ok, c.detail from pgfence.health_checks() c;
$$;
comment on function pgfence.health() is
  'One row per check of this installation: the schema of pgfence and of each layer as released, roles and grants, roles confined to this database, '
  'protections, the requeue job, nothing overdue, no start pending too long, no window left open, history within '
  'retention, and each layer''s checks. Read-only.';

revoke all on function pgfence.cron_job_problem(regprocedure) from public;
revoke all on function pgfence.health_checks() from public;
revoke all on function pgfence.health() from public;
grant execute on function pgfence.health() to pgfence_monitor, pgfence_operator;

commit;

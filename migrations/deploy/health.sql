-- Deploy pgfence:health
-- requires: protected_tables
-- requires: prune
-- requires: roles
-- requires: layers
--
-- Reworked in 0.3.0: the requeue job checked for real (it exists, is active, runs in this
-- database as a role that may run it, and calls it: pgfence.cron_job_problem, which the
-- layers' checks share, as lockdown_problems); a start pending too long is named. The
-- manifest it compares with is recorded by the release's last change (lockdown).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The schema's objects one by one, as migrations/fingerprint.sql sees them (the same items,
-- each with a digest of what the fingerprint hashes), so that a difference can be named.
create or replace function pgfence.schema_objects()
returns table (object text, digest text)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select format('function pgfence.%s(%s)', p.proname, pg_get_function_identity_arguments(p.oid)),
         md5(format('%s definer=%s volatility=%s config=%s body=%s', pg_get_function_result(p.oid),
                    p.prosecdef, p.provolatile, p.proconfig, md5(p.prosrc)))
    from pg_proc p
   where p.pronamespace = 'pgfence'::regnamespace
  union all
  select format('relation pgfence.%s', c.relname), c.relkind::text
    from pg_class c
   where c.relnamespace = 'pgfence'::regnamespace and c.relkind <> 'i'
  union all
  select format('column pgfence.%s.%s', c.relname, a.attname),
         md5(format('%s notnull=%s default=%s identity=%s', format_type(a.atttypid, a.atttypmod),
                    a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attidentity))
    from pg_attribute a
    join pg_class c on c.oid = a.attrelid
    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
   where c.relnamespace = 'pgfence'::regnamespace
     and c.relkind in ('r', 'v', 'p') and a.attnum > 0 and not a.attisdropped
  union all
  select format('constraint pgfence.%s.%s', c.relname, k.conname), md5(pg_get_constraintdef(k.oid))
    from pg_constraint k
    join pg_class c on c.oid = k.conrelid
   where c.relnamespace = 'pgfence'::regnamespace and k.contype <> 'n'
  union all
  select format('index pgfence.%s', ic.relname), md5(pg_get_indexdef(i.indexrelid))
    from pg_index i
    join pg_class c on c.oid = i.indrelid
    join pg_class ic on ic.oid = i.indexrelid
   where c.relnamespace = 'pgfence'::regnamespace;
$$;
comment on function pgfence.schema_objects() is
  'The pgfence schema object by object (functions, relations, columns, constraints, indexes), each with a digest of its definition.';

-- What the release installed (pgfence.schema_objects()), which health() compares with:
-- recorded by the release's last change (lockdown), which every install and upgrade ends with.
-- Created here on a fresh install, kept as it is on an upgrade.
create table if not exists pgfence.manifest (
  object text primary key,
  digest text not null
);
comment on table pgfence.manifest is
  'The schema objects as this release installed them (pgfence.schema_objects()), which pgfence.health() compares with.';
revoke all on pgfence.manifest from public;

-- What lockdown would revoke in schema_name, named: every privilege on the schema or an
-- object in it (function, relation, column, type) held by a role other than its owner and the
-- three pgfence roles. The check "roles and grants" of the core and each layer's "locked down".
create or replace function pgfence.lockdown_problems(schema_name name)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  with allowed as (select oid from pg_roles where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor')),
       n as (select oid from pg_namespace where nspname = lockdown_problems.schema_name),
       held as (
    select a.grantee, a.privilege_type, p.oid::regprocedure::text as what, p.proowner as owner
      from pg_proc p, aclexplode(p.proacl) a where p.pronamespace = (select oid from n)
    union all
    select a.grantee, a.privilege_type, c.oid::regclass::text, c.relowner
      from pg_class c, aclexplode(c.relacl) a where c.relnamespace = (select oid from n)
    union all
    select a.grantee, a.privilege_type, format('%s.%I', c.oid::regclass, t.attname), c.relowner
      from pg_class c join pg_attribute t on t.attrelid = c.oid and t.attacl is not null, aclexplode(t.attacl) a
     where c.relnamespace = (select oid from n)
    union all
    select a.grantee, a.privilege_type, format('type %s', y.oid::regtype), y.typowner
      from pg_type y, aclexplode(y.typacl) a
     where y.typnamespace = (select oid from n) and y.typtype in ('d', 'e', 'r', 'm')
    union all
    select a.grantee, a.privilege_type, format('schema %I', s.nspname), s.nspowner
      from pg_namespace s, aclexplode(s.nspacl) a where s.oid = (select oid from n))
  select string_agg(format('%s may %s %s', case h.grantee when 0 then 'PUBLIC' else h.grantee::regrole::text end,
                           h.privilege_type, h.what), '; ' order by h.what, h.grantee, h.privilege_type)
    from held h
   where h.grantee <> h.owner and h.grantee not in (select oid from allowed);
$$;
comment on function pgfence.lockdown_problems(name) is
  'The privileges in schema_name that lockdown would revoke, named; NULL when there are none.';

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
    return format('pg_cron is not installed: schedule %s', v_name);
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
  v_layer regproc;
begin
  -- Schema as installed: nothing changed, added or removed by hand since.
  name := 'schema matches its release';
  select string_agg(format('%s %s', x.object, x.how), '; ' order by x.object) into v_bad
    from (select coalesce(m.object, s.object) as object,
                 case when m.object is null then 'added' when s.object is null then 'missing'
                      else 'changed' end as how
            from pgfence.manifest m
            full join pgfence.schema_objects() s on s.object = m.object
           where m.digest is distinct from s.digest) x;
  ok := v_bad is null;
  detail := coalesce(v_bad, format('pgfence %s, %s objects as installed', pgfence.version(),
                                   (select count(*) from pgfence.manifest)));
  return next;

  -- Roles and grants as installed: the three roles exist, PUBLIC and other roles hold nothing
  -- in schema pgfence but what its owner and the three roles hold (lockdown's rule).
  name := 'roles and grants';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('role %s is missing', r) as x
      from unnest(array['pgfence_worker', 'pgfence_operator', 'pgfence_monitor']) r
     where not exists (select from pg_roles where rolname = r)
    union all
    select pgfence.lockdown_problems('pgfence')) y;
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
  name := 'no lease or task overdue';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('resource %s: its lease (generation %s) expired at %s and nobody took over',
                  l.resource, l.generation, l.expires_at) as x
      from pgfence.leases l join pgfence.resources r using (resource)
     where l.state = 'active' and r.enabled and l.expires_at < clock_timestamp() - interval '1 minute'
    union all
    select format('queue %s: %s claimed tasks past their visibility, the oldest since %s',
                  t.queue, count(*), min(t.visible_until))
      from pgfence.tasks t
     where t.state = 'claimed' and t.visible_until < clock_timestamp() - interval '1 minute'
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

  -- Twice prune's default bound: older history means no prune runs.
  name := 'history within retention';
  select string_agg(x, '; ' order by x) into v_bad from (
    select format('%s finished tasks older than 14 days', count(*)) as x
      from pgfence.tasks t where t.state in ('completed', 'failed') and t.finished_at < clock_timestamp() - interval '14 days'
    having count(*) > 0
    union all
    select format('%s ended leases older than 14 days', count(*))
      from pgfence.leases l where l.state in ('released', 'superseded') and l.ended_at < clock_timestamp() - interval '14 days'
    having count(*) > 0
    union all
    select format('%s invocations expired over 14 days ago', count(*))
      from pgfence.invocations i where i.expires_at < clock_timestamp() - interval '14 days'
    having count(*) > 0) y;
  ok := v_bad is null;
  detail := coalesce(v_bad || ': schedule pgfence.prune() (docs/operations.md)', 'nothing older than 14 days');
  return next;

  -- Each registered layer's own checks (pgfence.layers: the core names no layer).
  for v_layer in select l.health::regproc from pgfence.layers l where l.health is not null
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
  'One row per check of this installation: schema as released, roles and grants, roles confined to this database, '
  'protections, the requeue job, nothing overdue, no start pending too long, no window left open, history within '
  'retention, and each layer''s checks. Read-only.';

revoke all on function pgfence.schema_objects() from public;
revoke all on function pgfence.lockdown_problems(name), pgfence.cron_job_problem(regprocedure) from public;
revoke all on function pgfence.health_checks() from public;
revoke all on function pgfence.health() from public;
grant execute on function pgfence.health() to pgfence_monitor, pgfence_operator;

commit;

-- Revert pgfence:health: back to its definitions of release 0.2.1
--
-- health's manifest of 0.2.1 (pgfence.manifest) is written again by the revert of `releases`,
-- which runs after this one, from the schema as it then is.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.cron_job_problem(regprocedure);

-- The schema's objects one by one, as migrations/fingerprint.sql sees them (the same items,
-- each with a digest of what the fingerprint hashes), so that a difference can be named.
create function pgfence.schema_objects()
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
  v_jobs regclass := to_regclass('cron.job');
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
    select format('%s may %s %s', case a.grantee when 0 then 'PUBLIC' else a.grantee::regrole::text end,
                  a.privilege_type, p.oid::regprocedure)
      from pg_proc p, aclexplode(p.proacl) a
     where p.pronamespace = 'pgfence'::regnamespace and a.grantee <> p.proowner
       and a.grantee not in (select oid from pg_roles
                              where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'))
    union all
    select format('%s may %s %s', case a.grantee when 0 then 'PUBLIC' else a.grantee::regrole::text end,
                  a.privilege_type, c.oid::regclass)
      from pg_class c, aclexplode(c.relacl) a
     where c.relnamespace = 'pgfence'::regnamespace and a.grantee <> c.relowner
       and a.grantee not in (select oid from pg_roles
                              where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'))
    union all
    select format('%s may %s schema pgfence', case a.grantee when 0 then 'PUBLIC' else a.grantee::regrole::text end,
                  a.privilege_type)
      from pg_namespace n, aclexplode(n.nspacl) a
     where n.oid = 'pgfence'::regnamespace and a.grantee <> n.nspowner
       and a.grantee not in (select oid from pg_roles
                              where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'))) y;
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
  -- its claimed tasks for ever.
  name := 'requeue job scheduled';
  if v_jobs is null then
    ok := false;
    detail := 'pg_cron is not installed: schedule pgfence.requeue_expired() (docs/supabase.md)';
  else
    execute format('select count(*) > 0 from %s where active and command ~ %L', v_jobs,
                   'pgfence\.requeue_expired')
      into ok;
    detail := case when ok then 'a pg_cron job runs pgfence.requeue_expired()'
                   else 'no active pg_cron job runs pgfence.requeue_expired() (docs/supabase.md)' end;
  end if;
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
  'protections, the requeue job, nothing overdue, no window left open, history within retention. Read-only.';

revoke all on function pgfence.schema_objects() from public;
revoke all on function pgfence.health_checks() from public;
revoke all on function pgfence.health() from public;
grant execute on function pgfence.health() to pgfence_monitor, pgfence_operator;

commit;

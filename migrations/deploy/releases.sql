-- Deploy pgfence:releases
-- requires: version
-- requires: lockdown
-- requires: health
--
-- One record of each pgfence schema (the core's and each layer's) as its release installed it,
-- and one change per release that writes it. Before 0.3.0 a release reworked `version` (a
-- literal) and `lockdown` (to run last), and health kept a manifest that each of those reworks
-- patched, beside a fingerprint that only the upgrade files read. From 0.3.0 on:
--
--   pgfence.schema_objects(schema)   the one rule: every object of a pgfence schema that drift
--                                    can change, each with a digest of its definition
--   pgfence.seal(schema, release)    what a release's last change calls: lockdown, then the
--                                    record of schema_objects and the release's name
--   pgfence.schema_drift(schema)     what differs from the record (health names it)
--   pgfence.check_release(...)       what an upgrade file calls before it changes anything
--
-- The first change after a release checks that the database holds that release
-- (pgfence.expect_release), so that Sqitch never deploys over a database that another path
-- (the one file, the CLI) moved: scripts/bundle checks that it does.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The first change after release 0.2.1: Sqitch runs it only on a database its registry says
-- holds 0.2.1. One that holds another release (installed or upgraded by another path) is
-- refused before anything changes. (pgfence.expect_release does this from 0.3.0 on. In
-- sql/pgfence.sql, which runs each change once at its latest place, version() comes later.)
do $guard$
declare
  v_found text;
begin
  if pg_catalog.to_regprocedure('pgfence.version()') is null then
    return;
  end if;
  execute 'select pgfence.version()' into v_found;
  if v_found is distinct from '0.2.1' then
    raise exception 'pgfence: this database holds pgfence %, not 0.2.1 as the Sqitch registry says: '
                    'it was installed or upgraded without Sqitch; nothing was deployed', v_found
      using errcode = '55000',
            hint = pg_catalog.format('record what it holds instead of deploying it: sqitch deploy '
                                     '--log-only --to @v%s, then sqitch verify (docs/upgrading.md, '
                                     '"Moving onto Sqitch")', v_found);
  end if;
end
$guard$;

-- Every release sealed in this database, per schema. The newest row of a schema is what it
-- holds (pgfence.installed_release); a Sqitch revert of a release's change removes its row, so
-- the one before it is held again.
create table pgfence.releases (
  schema_name name not null check (schema_name = 'pgfence' or schema_name like 'pgfence\_%'),
  release     text not null check (release ~ '^\d+\.\d+\.\d+$'),
  seq         bigint generated always as identity,
  sealed_at   timestamptz not null default clock_timestamp(),
  primary key (schema_name, release)
);
comment on table pgfence.releases is
  'The releases of pgfence and of its layers sealed in this database (pgfence.seal); the newest of a schema is installed.';

-- What each release installed in each schema: pgfence.schema_objects as pgfence.seal saw it.
-- Kept per release, so that a revert to an earlier release finds that release's record.
create table pgfence.schema_records (
  schema_name name not null,
  release     text not null,
  object      text not null,
  digest      text not null,
  primary key (schema_name, release, object),
  foreign key (schema_name, release) references pgfence.releases on delete cascade
);
comment on table pgfence.schema_records is
  'The objects of each pgfence schema as each sealed release installed them (pgfence.schema_objects).';

-- 0.2.1's record (health's manifest) is replaced by the one above; a revert to 0.2.1 writes it
-- again from the schema it reverted to. (sql/pgfence.sql never made it.)
do $$
begin
  if pg_catalog.to_regclass('pgfence.manifest') is not null then
    drop table pgfence.manifest;
  end if;
end
$$;

-- An ACL as a record holds it: effective privileges (a NULL ACL is its kind's default), one
-- grantee=privilege(*grantable) each, sorted, the schema's owner named as such. The object
-- owner's own privileges are left out: they are implicit, and differ between PostgreSQL
-- versions (17 gives owners MAINTAIN on tables) though the grants are the same.
create function pgfence.acl_text(acl aclitem[], kind "char", owner oid, schema_owner oid)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(string_agg(format('%s=%s%s',
                                    case when a.grantee = 0 then 'PUBLIC'
                                         when a.grantee = acl_text.schema_owner then 'schema owner'
                                         else a.grantee::regrole::text end,
                                    a.privilege_type, case when a.is_grantable then '*' end),
                             ',' order by 1), '')
    from aclexplode(coalesce(acl_text.acl, acldefault(acl_text.kind, acl_text.owner))) a
   where a.grantee <> acl_text.owner;
$$;
comment on function pgfence.acl_text(aclitem[], "char", oid, oid) is
  'An ACL as pgfence.schema_objects digests it: effective privileges, sorted, the schema owner named as such.';

-- Deparsed SQL without the qualifiers of column references (PostgreSQL 16 and later print
-- `queue` where 15 prints `t.queue`): a schema-qualified function or relation keeps its
-- schema, because a view's digest also names what it reads.
create function pgfence.deparsed(sql text)
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select regexp_replace(deparsed.sql, '\m[a-z_][a-z0-9_$]*\.(?=[a-z_"])', '', 'g');
$$;
comment on function pgfence.deparsed(text) is
  'Deparsed SQL as pgfence.schema_objects digests it: without qualifiers, the same on every PostgreSQL version.';

-- The objects of a pgfence schema (the core's or a layer's) that drift can change, each with a
-- digest of its definition: functions (signature, result, language, security, volatility,
-- settings, body), relations, columns, constraints, indexes, view definitions, triggers (those
-- a function of the schema runs, wherever they are, and the others on its tables), policies,
-- types, owners, and every ACL (functions, relations, columns, types, the schema: rows
-- 'acl OBJECT', which health's "roles and grants" reads, the rest its "schema matches its
-- release"). A digest
-- holds nothing that differs between two databases holding the same release: an owner is
-- 'schema owner' or its name, an ACL lists effective privileges (a NULL ACL as the default it
-- stands for) with the schema's owner as 'schema owner'; deparsed text (views, triggers,
-- policies) drops the qualifiers of column references, which PostgreSQL 16 and later print
-- only where a query has several relations, and a view's digest adds the relations and
-- functions it reads, schema-qualified. So the same release gives the same record on every
-- PostgreSQL version and after pg_upgrade, and the md5 of the record (schema_fingerprint) is
-- the release's fingerprint.
create function pgfence.schema_objects(schema_name name)
returns table (object text, digest text)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  with s as (
    select n.oid, n.nspname, n.nspowner, n.nspacl from pg_namespace n
     where n.nspname = schema_objects.schema_name),
  -- A role as a record names it: the schema's owner is whoever installed pgfence there.
  who as (
    select r.oid, case when r.oid = s.nspowner then 'schema owner' else r.rolname::text end as name
      from pg_roles r, s
    union all
    select 0, 'PUBLIC'),
  rel as (
    select c.* from pg_class c, s where c.relnamespace = s.oid),
  fn as (
    select p.* from pg_proc p, s where p.pronamespace = s.oid),
  -- Who may do what: one row per object, 'acl OBJECT' (a column's only where it has an ACL).
  acl as (
    select format('schema %I', s.nspname) as object, pgfence.acl_text(s.nspacl, 'n', s.nspowner, s.nspowner) as acl
      from s
    union all
    select format('function %I.%I(%s)', s.nspname, p.proname, pg_get_function_identity_arguments(p.oid)),
           pgfence.acl_text(p.proacl, 'f', p.proowner, s.nspowner)
      from fn p, s
    union all
    select format('relation %I.%I', s.nspname, c.relname),
           pgfence.acl_text(c.relacl, (case c.relkind when 'S' then 's' else 'r' end)::"char", c.relowner, s.nspowner)
      from rel c, s
     where c.relkind <> 'i'
    union all
    select format('column %I.%I.%I', s.nspname, c.relname, a.attname),
           pgfence.acl_text(a.attacl, 'c', c.relowner, s.nspowner)
      from pg_attribute a join rel c on c.oid = a.attrelid cross join s
     where a.attacl is not null and a.attnum > 0 and not a.attisdropped
    union all
    select format('type %I.%I', s.nspname, y.typname), pgfence.acl_text(y.typacl, 'T', y.typowner, s.nspowner)
      from pg_type y, s
     where y.typnamespace = s.oid and y.typelem = 0
       and (y.typtype <> 'c' or (select c.relkind from pg_class c where c.oid = y.typrelid) = 'c'))
  select 'acl ' || a.object, md5(a.acl) from acl a
  union all
  select format('function %I.%I(%s)', s.nspname, p.proname, pg_get_function_identity_arguments(p.oid)),
         md5(format('%s kind=%s language=%s definer=%s volatility=%s strict=%s leakproof=%s parallel=%s '
                    'config=%s body=%s owner=%s',
                    pg_get_function_result(p.oid), p.prokind, l.lanname, p.prosecdef, p.provolatile,
                    p.proisstrict, p.proleakproof, p.proparallel, p.proconfig, md5(p.prosrc),
                    (select w.name from who w where w.oid = p.proowner)))
    from fn p, s, pg_language l
   where l.oid = p.prolang
  union all
  select format('relation %I.%I', s.nspname, c.relname),
         md5(format('kind=%s owner=%s rls=%s force_rls=%s', c.relkind, (select w.name from who w where w.oid = c.relowner),
                    c.relrowsecurity, c.relforcerowsecurity))
    from rel c, s
   where c.relkind <> 'i'
  union all
  select format('view %I.%I', s.nspname, c.relname),
         md5(format('%s reads %s', pgfence.deparsed(pg_get_viewdef(c.oid)),
                    (select string_agg(distinct case d.refclassid
                                         when 'pg_class'::regclass then d.refobjid::regclass::text
                                         else d.refobjid::regprocedure::text end, ', ')
                       from pg_rewrite w
                       join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = w.oid
                      where w.ev_class = c.oid and d.refobjid <> c.oid
                        and d.refclassid in ('pg_class'::regclass, 'pg_proc'::regclass))))
    from rel c, s
   where c.relkind in ('v', 'm')
  union all
  select format('column %I.%I.%I', s.nspname, c.relname, a.attname),
         md5(format('%s notnull=%s default=%s identity=%s generated=%s',
                    format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid),
                    a.attidentity, a.attgenerated))
    from pg_attribute a
    join rel c on c.oid = a.attrelid
    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
    cross join s
   where c.relkind in ('r', 'v', 'm', 'p', 'c', 'f') and a.attnum > 0 and not a.attisdropped
  union all
  select format('constraint %I.%I.%I', s.nspname, c.relname, k.conname), md5(pg_get_constraintdef(k.oid))
    from pg_constraint k
    join rel c on c.oid = k.conrelid
    cross join s
   where k.contype <> 'n'  -- PostgreSQL 18 lists NOT NULL here too (attnotnull has it)
  union all
  select format('index %I.%I', s.nspname, ic.relname), md5(pg_get_indexdef(i.indexrelid))
    from pg_index i
    join rel c on c.oid = i.indrelid
    join pg_class ic on ic.oid = i.indexrelid
    cross join s
  union all
  -- A trigger belongs to the pgfence schema of the function it runs (a layer's trigger on a
  -- core table is the layer's), else to the schema of its table. The guards that protect()
  -- puts on the tables it protects are not the release's: health checks them on their own.
  select format('trigger %s.%I', t.tgrelid::regclass, t.tgname),
         md5(format('%s enabled=%s', pgfence.deparsed(pg_get_triggerdef(t.oid)), t.tgenabled))
    from pg_trigger t
    join pg_proc f on f.oid = t.tgfoid
    join pg_namespace fn on fn.oid = f.pronamespace
    cross join s
   where not t.tgisinternal
     and not (fn.nspname = 'pgfence' and f.proname = 'guard')
     and (fn.oid = s.oid
          or (t.tgrelid in (select c.oid from rel c)
              and not (fn.nspname = 'pgfence' or fn.nspname like 'pgfence\_%')))
  union all
  select format('policy %I.%I.%I', s.nspname, c.relname, y.polname),
         md5(format('command=%s permissive=%s roles=%s using=%s check=%s', y.polcmd, y.polpermissive,
                    (select string_agg(coalesce(w.name, r::text), ',' order by coalesce(w.name, r::text))
                       from unnest(y.polroles) r left join who w on w.oid = r),
                    pgfence.deparsed(pg_get_expr(y.polqual, y.polrelid)),
                    pgfence.deparsed(pg_get_expr(y.polwithcheck, y.polrelid))))
    from pg_policy y
    join rel c on c.oid = y.polrelid
    cross join s
  union all
  -- Types of their own (not a table's row type, not an array); a composite type's attributes
  -- are columns above.
  select format('type %I.%I', s.nspname, y.typname),
         md5(format('kind=%s owner=%s', y.typtype, (select w.name from who w where w.oid = y.typowner)))
    from pg_type y, s
   where y.typnamespace = s.oid and y.typelem = 0
     and (y.typtype <> 'c' or (select c.relkind from pg_class c where c.oid = y.typrelid) = 'c');
$$;
comment on function pgfence.schema_objects(name) is
  'The objects of a pgfence schema that drift can change, each with a digest of its definition, the same for one '
  'release on every database and PostgreSQL version. Raises nothing; an unknown schema has no objects.';

create function pgfence.schema_fingerprint(schema_name name)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select md5(string_agg(format('%s %s', o.object, o.digest), E'\n' order by o.object))
    from pgfence.schema_objects(schema_fingerprint.schema_name) o;
$$;
comment on function pgfence.schema_fingerprint(name) is
  'The md5 of pgfence.schema_objects(schema_name): a release''s fingerprint (sql/releases/fingerprints).';

-- The release a schema holds: its newest seal.
create function pgfence.installed_release(schema_name name)
returns text
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  select r.release from pgfence.releases r
   where r.schema_name = installed_release.schema_name
   order by r.seq desc limit 1;
$$;
comment on function pgfence.installed_release(name) is
  'The release of pgfence (schema pgfence) or of a layer (pgfence_NAME) sealed last in this database, or NULL.';

-- What differs between a schema and the record of the release it holds: each object added,
-- missing or changed since; one row 'record' 'missing' where no release is sealed.
create function pgfence.schema_drift(schema_name name)
returns table (object text, how text)
language sql
stable
set search_path = pg_catalog, pg_temp
as $$
  with rec as (
    select x.object, x.digest from pgfence.schema_records x
     where x.schema_name = schema_drift.schema_name
       -- A subquery, so that it is looked up once, not once per row of the record.
       and x.release = (select pgfence.installed_release(schema_drift.schema_name)))
  select coalesce(r.object, o.object),
         case when r.object is null then 'added' when o.object is null then 'missing' else 'changed' end
    from rec r
    full join pgfence.schema_objects(schema_drift.schema_name) o on o.object = r.object
   where r.digest is distinct from o.digest
     and exists (select from rec)
  union all
  select 'record', 'missing' where not exists (select from rec)
  order by 1;
$$;
comment on function pgfence.schema_drift(name) is
  'The objects of a pgfence schema that differ from the record of the release it holds (added, missing, changed).';

-- Written by the last change of every release of pgfence and of each layer: nobody but the
-- owners and the three roles keeps a privilege in the schema (lockdown), then the schema as it
-- now is becomes the record of that release, which becomes the release the schema holds. Only
-- the owner runs it (no grant): as the installer.
create function pgfence.seal(schema_name name, release text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.lockdown(seal.schema_name);
  delete from pgfence.releases r where r.schema_name = seal.schema_name and r.release = seal.release;
  insert into pgfence.releases (schema_name, release) values (seal.schema_name, seal.release);
  insert into pgfence.schema_records (schema_name, release, object, digest)
  select seal.schema_name, seal.release, o.object, o.digest from pgfence.schema_objects(seal.schema_name) o;
end
$$;
comment on function pgfence.seal(name, text) is
  'Installer: the last step of a release of pgfence or a layer: lockdown, then the record of the schema as that release.';

-- The revert of a release's last change: its record goes, the release before it is held again.
create function pgfence.unseal(schema_name name, release text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  delete from pgfence.releases r where r.schema_name = unseal.schema_name and r.release = unseal.release;
  perform pgfence.lockdown(unseal.schema_name);
end
$$;
comment on function pgfence.unseal(name, text) is
  'Installer: the revert of a release''s last change: its record goes, the release sealed before it is installed again.';

-- The first change after a release begins with this: Sqitch deploys it only where its registry
-- says the database holds that release, which is wrong where another path (the one-file
-- upgrades, the CLI) moved it since; nothing is deployed then.
create function pgfence.expect_release(schema_name name, release text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_found text := pgfence.installed_release(expect_release.schema_name);
begin
  if v_found is distinct from expect_release.release then
    raise exception 'pgfence: schema % holds release %, not % as the Sqitch registry says: it was installed '
                    'or upgraded without Sqitch; nothing was deployed',
                    expect_release.schema_name, coalesce(v_found, 'none'), expect_release.release
      using errcode = '55000',
            hint = pg_catalog.format('record what it holds instead of deploying it: sqitch deploy --log-only '
                                     '--to @v%s, then sqitch verify (docs/upgrading.md, "Moving onto Sqitch")',
                                     coalesce(v_found, expect_release.release));
  end if;
end
$$;
comment on function pgfence.expect_release(name, text) is
  'Installer: raises 55000 unless the schema holds this release (the guard of the first change after a release).';

-- What an upgrade file checks before it changes anything: the schema holds exactly this
-- release, as recorded (nothing changed, added or removed by hand since: each such object is
-- named) and as released (its fingerprint, from the package).
create function pgfence.check_release(schema_name name, release text, fingerprint text)
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_found text := pgfence.installed_release(check_release.schema_name);
  v_drift text;
  v_print text;
begin
  if v_found is distinct from check_release.release then
    raise exception 'pgfence: this file upgrades % from release %, but the database holds %',
                    check_release.schema_name, check_release.release, coalesce(v_found, 'none')
      using errcode = '55000',
            hint = 'apply the upgrade files in order from the installed release (docs/upgrading.md)';
  end if;
  select string_agg(format('%s %s', d.object, d.how), '; ') into v_drift
    from pgfence.schema_drift(check_release.schema_name) d;
  if v_drift is not null then
    raise exception 'pgfence: schema % differs from its release % as installed (changed by hand?)',
                    check_release.schema_name, check_release.release
      using errcode = '55000', detail = v_drift,
            hint = 'restore the released definitions (sql/releases/), then upgrade';
  end if;
  v_print := pgfence.schema_fingerprint(check_release.schema_name);
  if v_print is distinct from check_release.fingerprint then
    raise exception 'pgfence: schema % is not release % as released', check_release.schema_name, check_release.release
      using errcode = '55000',
            detail = pg_catalog.format('schema fingerprint %s, the release has %s', v_print, check_release.fingerprint),
            hint = 'it was installed from another build of that release: reinstall it from the release''s files';
  end if;
end
$$;
comment on function pgfence.check_release(name, text, text) is
  'Installer: raises 55000 unless the schema holds exactly this release, as recorded and as released (the fingerprint).';

revoke all on table pgfence.releases, pgfence.schema_records from public;
grant select on table pgfence.releases to pgfence_monitor, pgfence_operator;
revoke all on function pgfence.schema_objects(name), pgfence.acl_text(aclitem[], "char", oid, oid),
                       pgfence.deparsed(text), pgfence.schema_fingerprint(name), pgfence.installed_release(name),
                       pgfence.schema_drift(name), pgfence.seal(name, text), pgfence.unseal(name, text),
                       pgfence.expect_release(name, text), pgfence.check_release(name, text, text)
  from public;

commit;

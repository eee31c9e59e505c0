-- Deploy pgfence:protected_tables
-- requires: protections
-- requires: protect

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Protection can stop protecting without an error: the guard dropped, disabled (or made to
-- fire only in replica mode) or renamed, its arguments changed, or the table attached to an
-- inheritance or partition tree after protect (a statement trigger does not see writes that
-- name another member of the tree). Each protected table, and what is wrong with it.
create view pgfence.protected_tables as
select p.tbl::text as table_name,
       p.resources,
       p.mode,
       p.events,
       g.tgname is not null as guard_present,
       coalesce(g.tgenabled in ('O', 'A'), false) as guard_enabled,
       coalesce(c.relkind = 'r' and not c.relispartition and not tree.member, false) as plain_table,
       problem.text is null as healthy,
       problem.text as problem
  from pgfence.protections p
  left join pg_catalog.pg_class c on c.oid = p.tbl
  left join lateral (
         select t.tgname, t.tgenabled, t.tgtype, t.tgqual, t.tgattr,
                pg_catalog.string_to_array(pg_catalog.encode(t.tgargs, 'escape'), '\000') as args
           from pg_catalog.pg_trigger t
          where t.tgrelid = p.tbl and t.tgfoid = 'pgfence.guard()'::regprocedure
          order by t.tgname = 'pgfence_guard' desc, t.tgname
          limit 1) g on true
  cross join lateral (
         select exists (select from pg_catalog.pg_inherits i
                         where i.inhrelid = p.tbl or i.inhparent = p.tbl) as member) tree
  cross join lateral (
         select case when c.oid is null then 'the table no longer exists'
                     when g.tgname is null then 'the guard trigger is missing'
                     when g.tgenabled not in ('O', 'A') then 'the guard trigger is disabled'
                     -- What it fires for: after each statement (tgtype bit 1 row, 2 before,
                     -- 64 instead of), for exactly the protection's events (4 insert, 8
                     -- delete, 16 update, 32 truncate), whatever columns an update names, with
                     -- no WHEN condition. A guard recreated AFTER TRUNCATE only, or WHEN
                     -- (false), lets unfenced writes pass.
                     when g.tgtype::int & 67 <> 0
                     then 'the guard trigger does not fire after each statement'
                     when g.tgtype::int & 60 <> (case when 'insert' = any (p.events) then 4 else 0 end) + 56
                     then pg_catalog.format('the guard trigger does not fire for exactly %s',
                                            pg_catalog.array_to_string(p.events, ', '))
                     when g.tgqual is not null then 'the guard trigger has a WHEN condition'
                     when pg_catalog.cardinality(g.tgattr::int2[]) > 0
                     then 'the guard trigger fires only for updates of some columns'
                     when g.tgname <> 'pgfence_guard' then pg_catalog.format('the guard trigger was renamed to %I', g.tgname)
                     -- args: the resources, the mode, and an empty string after the last NUL
                     when not (g.args[1:cardinality(g.args) - 2] @> p.resources
                               and p.resources @> g.args[1:cardinality(g.args) - 2])
                          or g.args[cardinality(g.args) - 1] is distinct from p.mode
                     then 'the guard trigger''s resource or mode differs from what protect set'
                     when c.relkind <> 'r' or c.relispartition or tree.member
                     then 'the table is no longer a plain table outside any inheritance or partition tree'
                end as text) problem;
comment on view pgfence.protected_tables is
  'One row per protected table: its resources, mode and the writes it covers, whether its guard is present and '
  'enabled, fires after each statement for exactly those writes with no WHEN condition, and the table is still a '
  'plain table outside any inheritance or partition tree; healthy, or the problem. Run protect again to repair.';

revoke all on pgfence.protected_tables from public;
grant select on pgfence.protected_tables to pgfence_monitor, pgfence_operator;

commit;

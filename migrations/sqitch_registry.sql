-- The Sqitch registries in this database that track project pgfence: the names of the schemas
-- holding them, comma-separated, or NULL when none does. A registry is a schema with Sqitch's
-- tables `projects` and `changes` (`sqitch` unless engine.pg.registry says otherwise, so every
-- schema is looked at); it tracks pgfence once `sqitch deploy` of this project ran there, even
-- if everything was reverted since. One install path per database: the upgrade files and the
-- newest full install refuse such a database (the Sqitch changes would otherwise no longer say
-- what it holds), and `pgfence install`/`upgrade` refuse it before asking for confirmation,
-- naming the Sqitch command instead. Not a Sqitch change: scripts/bundle inlines it into those
-- files and copies it to sql/queries/ for the CLI. One statement, read-only (query_to_xml reads
-- the registry whose schema name is only known here).
-- Tables are found in pg_class, and read only where the caller may: to_regclass of a schema the
-- caller cannot use (pg_toast on Supabase) is an error, not NULL.
select pg_catalog.string_agg(n.nspname::pg_catalog.text, ', ' order by n.nspname)
  from pg_catalog.pg_namespace n
  left join pg_catalog.pg_class p
    on p.relnamespace operator(pg_catalog.=) n.oid and p.relname operator(pg_catalog.=) 'projects'
   and p.relkind operator(pg_catalog.=) any ('{r,p}')
 where case when p.oid is null
              or not exists (select from pg_catalog.pg_class c
                              where c.relnamespace operator(pg_catalog.=) n.oid
                                and c.relname operator(pg_catalog.=) 'changes')
              or not pg_catalog.has_schema_privilege(n.oid, 'usage')
              or not pg_catalog.has_table_privilege(p.oid, 'select')
            then false
            else (pg_catalog.xpath('/row/n/text()', pg_catalog.query_to_xml(pg_catalog.format(
                    'select count(*) as n from %I.projects where project = %L',
                    n.nspname, 'pgfence'), false, true, '')))[1]::pg_catalog.text
                 operator(pg_catalog.<>) '0'
       end;

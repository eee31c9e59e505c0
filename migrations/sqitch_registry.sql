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
select pg_catalog.string_agg(n.nspname::pg_catalog.text, ', ' order by n.nspname)
  from pg_catalog.pg_namespace n
 where case when pg_catalog.to_regclass(pg_catalog.format('%I.projects', n.nspname)) is null
              or pg_catalog.to_regclass(pg_catalog.format('%I.changes', n.nspname)) is null
            then false
            else (pg_catalog.xpath('/row/n/text()', pg_catalog.query_to_xml(pg_catalog.format(
                    'select count(*) as n from %I.projects where project = %L',
                    n.nspname, 'pgfence'), false, true, '')))[1]::pg_catalog.text
                 operator(pg_catalog.<>) '0'
       end;

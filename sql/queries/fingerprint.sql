-- the fingerprint of the pgfence schema: a copy of migrations/fingerprint.sql, written by scripts/bundle. Do not edit.
-- The fingerprint of the pgfence schema: one md5 over its functions (signature, result,
-- security, volatility, settings and body), relations, columns, constraints and indexes.
-- It leaves out what differs between databases holding the same release (owners, OIDs,
-- privileges, column order, data) and what PostgreSQL versions print differently (view
-- bodies, whose columns it does include). An upgrade file checks the database against the
-- fingerprint recorded for the release it starts from (sql/releases/fingerprints), so it
-- never runs over a schema that someone changed by hand. Not a Sqitch change: scripts/bundle
-- inlines it into every upgrade file, and tests/test_upgrade.py records and checks it.
-- The optional layers live in schemas of their own: a database with a layer holds the same
-- release of pgfence as one without it.
select pg_catalog.md5(pg_catalog.string_agg(x, E'\n' order by x))
  from (select pg_catalog.format('function %s(%s) %s definer=%s volatility=%s config=%s body=%s',
                                 p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid),
                                 pg_catalog.pg_get_function_result(p.oid), p.prosecdef, p.provolatile,
                                 p.proconfig, pg_catalog.md5(p.prosrc))
          from pg_catalog.pg_proc p
         where p.pronamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace
        union all
        select pg_catalog.format('relation %s %s', c.relname, c.relkind)
          from pg_catalog.pg_class c
         where c.relnamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace
        union all
        select pg_catalog.format('column %s.%s %s notnull=%s default=%s identity=%s', c.relname, a.attname,
                                 pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                 pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attidentity)
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) a.attrelid
          left join pg_catalog.pg_attrdef d
                 on d.adrelid operator(pg_catalog.=) a.attrelid and d.adnum operator(pg_catalog.=) a.attnum
         where c.relnamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace
           and a.attnum operator(pg_catalog.>) 0 and not a.attisdropped
        union all
        select pg_catalog.format('constraint %s.%s %s', c.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid))
          from pg_catalog.pg_constraint k
          join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) k.conrelid
         where c.relnamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace
           and k.contype operator(pg_catalog.<>) 'n'  -- PostgreSQL 18 lists NOT NULL here too (attnotnull has it)
        union all
        select pg_catalog.format('index %s', pg_catalog.pg_get_indexdef(i.indexrelid))
          from pg_catalog.pg_index i
          join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) i.indrelid
         where c.relnamespace operator(pg_catalog.=) 'pgfence'::pg_catalog.regnamespace) s(x);

-- pg_upgrade carries an install as it is: no table of a pgfence schema (the core's or an
-- installed layer's)
-- has a column of a reg* type whose OIDs pg_upgrade does not keep (it refuses the database:
-- "reg* data types in user tables"; regclass, regrole and regtype it keeps). pgfence.layers
-- names functions as text from 0.3.0 on; tests/test_major_upgrade.py runs pg_upgrade itself.
begin;
select plan(1);

select is_empty($$
  select format('%s.%s', c.oid::regclass, a.attname)
    from pg_class c
    join pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
   where c.relnamespace in (select oid from pg_namespace where nspname like 'pgfence%')
     and c.relkind in ('r', 'p', 'm')
     and a.atttypid in ('regcollation'::regtype, 'regconfig'::regtype, 'regdictionary'::regtype,
                        'regnamespace'::regtype, 'regoper'::regtype, 'regoperator'::regtype,
                        'regproc'::regtype, 'regprocedure'::regtype)
$$, 'no pgfence table holds a reg* column that pg_upgrade refuses');

select * from finish();
rollback;

-- protect(tbl, resources[], mode): a table written by intentional replicas accepts a write
-- from a transaction that fenced any one of its resources, and no other; bad sets are refused
-- whole (nothing protected).
begin;
select plan(17);
select pgfence_test.reset();
create table sr_rows (id int);
create temp table l on commit drop as
  select pgfence_test.lease('a') as a, pgfence_test.lease('b') as b, pgfence_test.lease('c') as c;

select throws_ok($$ select pgfence.protect('sr_rows', null::text[]) $$, '22023', null, 'NULL resources');
select throws_ok($$ select pgfence.protect('sr_rows', '{}'::text[]) $$, '22023', null, 'no resources');
select throws_ok($$ select pgfence.protect('sr_rows', array['a', null]) $$, '22023', null, 'a NULL resource');
select throws_ok($$ select pgfence.protect('sr_rows', array['a', ' b']) $$, '22023', null, 'a bad resource name');
select throws_ok($$ select pgfence.protect('sr_rows', array(select 'a' from generate_series(1, 101))) $$, '22023', null,
                 'over 100 resources');
select throws_ok($$ select pgfence.protect('sr_rows', array['a', 'nosuch', 'zzz']) $$, 'PF002',
                 'pgfence: resource nosuch, zzz is not registered', 'unknown resources, all named');
select throws_ok($$ select pgfence.protect('sr_rows', array['a', 'b'], 'audit') $$, '22023', null, 'a bad mode');
select is((select count(*)::int from pgfence.protections), 0, 'none of them protected anything');

select lives_ok($$ select pgfence.protect('sr_rows', array['b', 'a', 'b']) $$, 'two resources (one named twice)');
select results_eq($$ select resources, mode, healthy from pgfence.protected_tables $$,
                  $$ values (array['a', 'b'], 'enforce', true) $$, 'recorded once each, in order, healthy');

savepoint s;
select pgfence.fence((select a from l));
select lives_ok($$ insert into sr_rows values (1) $$, 'a fence of the first admits the write');
rollback to s;
select pgfence.fence((select b from l));
select lives_ok($$ insert into sr_rows values (2) $$, 'a fence of the second too');
rollback to s;
select pgfence.fence((select c from l));
select throws_ok($$ insert into sr_rows values (3) $$, 'PF007',
                 'pgfence: unfenced INSERT on public.sr_rows, which is protected for resource a or b',
                 'a fence of another resource does not');
rollback to s;

select pgfence.protect('sr_rows', array['a', 'b'], 'observe');
insert into sr_rows values (4);
select results_eq($$ select resource, operation from pgfence.unfenced_writes $$, $$ values ('a,b', 'INSERT') $$,
                  'observe records the write with both resources');

select lives_ok($$ select pgfence.protect('sr_rows', 'a') $$, 'the one-resource form replaces it');
select results_eq($$ select resources, mode, healthy from pgfence.protected_tables $$,
                  $$ values (array['a'], 'enforce', true) $$, 'with its one resource');
select pgfence.fence((select b from l));
select throws_ok($$ insert into sr_rows values (5) $$, 'PF007', null, 'and b no longer admits a write');

select * from finish();
rollback;

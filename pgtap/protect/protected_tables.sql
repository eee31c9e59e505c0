-- pgfence.protected_tables: every protection, and what silently broke it.
begin;
select plan(14);
select pgfence_test.reset();
select pgfence.register('r');
select pgfence.register('s');
create table pt_ok (id int);
create table pt_dropped (id int);
create table pt_disabled (id int);
create table pt_replica (id int);
create table pt_renamed (id int);
create table pt_child (id int);
create table pt_parent (id int);
create table pt_args (id int);
select pgfence.protect(t, 'r') from unnest(array['pt_ok', 'pt_dropped', 'pt_disabled', 'pt_replica',
                                                 'pt_renamed', 'pt_child', 'pt_args']::regclass[]) t;
select pgfence.protect('pt_ok', 'r', 'observe');  -- switching modes replaces the guard

drop trigger pgfence_guard on pt_dropped;
alter table pt_disabled disable trigger pgfence_guard;
alter table pt_replica enable replica trigger pgfence_guard;
alter trigger pgfence_guard on pt_renamed rename to something_else;
alter table pt_child inherit pt_parent;
create or replace trigger pgfence_guard after insert on pt_args for each statement execute function pgfence.guard('s', 'enforce');

select is((select healthy from pgfence.protected_tables where table_name = 'pt_ok'), true, 'an intact protection is healthy');
select is((select mode from pgfence.protected_tables where table_name = 'pt_ok'), 'observe', 'protect again switched its mode');
select is((select count(*) from pg_trigger where tgrelid = 'pt_ok'::regclass), 1::bigint, 'with one guard, replaced');
select is((select problem from pgfence.protected_tables where table_name = 'pt_dropped'), 'the guard trigger is missing', 'a dropped guard');
select is((select problem from pgfence.protected_tables where table_name = 'pt_disabled'), 'the guard trigger is disabled', 'a disabled guard');
select is((select problem from pgfence.protected_tables where table_name = 'pt_replica'), 'the guard trigger is disabled', 'a guard firing only in replica mode');
select is((select problem from pgfence.protected_tables where table_name = 'pt_renamed'), 'the guard trigger was renamed to something_else', 'a renamed guard');
select is((select problem from pgfence.protected_tables where table_name = 'pt_child'),
          'the table is no longer a plain table outside any inheritance or partition tree', 'a table attached to an inheritance tree');
select is((select problem from pgfence.protected_tables where table_name = 'pt_args'),
          'the guard trigger''s resource or mode differs from what protect set', 'a guard recreated for another resource');
select is((select count(*) from pgfence.protected_tables where not healthy), 6::bigint, 'six problems, no more');

select pgfence.protect('pt_renamed', 'r');
select is((select count(*) from pg_trigger where tgrelid = 'pt_renamed'::regclass), 1::bigint,
          'protect again replaces a renamed guard instead of adding a second');
select is((select healthy from pgfence.protected_tables where table_name = 'pt_renamed'), true, 'and it is healthy again');
select pgfence.unprotect('pt_dropped');
select is((select count(*) from pgfence.protected_tables where table_name = 'pt_dropped'), 0::bigint, 'unprotect forgets the table');
drop table pt_ok;
select is((select problem from pgfence.protected_tables where healthy is false and table_name !~ '^pt_'), 'the table no longer exists',
          'a dropped table is reported');

select * from finish();
rollback;

-- pgfence.protected_tables: every protection, and what silently broke it.
begin;
select plan(23);
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
-- The crippled forms of a guard that is present, enabled and ours (issue 26, item 2): each
-- lets unfenced writes pass, and each was reported healthy before the guard's events, timing,
-- level, columns and WHEN condition were checked.
create table pt_truncate_only (id int);
create table pt_when_false (id int);
create table pt_before (id int);
create table pt_row (id int);
create table pt_update_of (id int);
create table pt_no_insert (id int);
create table pt_consumers (id int);
create table pt_consumers_insert (id int);
select pgfence.protect(t, 'r') from unnest(array['pt_ok', 'pt_dropped', 'pt_disabled', 'pt_replica',
                                                 'pt_renamed', 'pt_child', 'pt_args', 'pt_truncate_only',
                                                 'pt_when_false', 'pt_before', 'pt_row', 'pt_update_of',
                                                 'pt_no_insert']::regclass[]) t;
select pgfence.protect(t, array['r'], 'enforce', consumers_only => true)
  from unnest(array['pt_consumers', 'pt_consumers_insert']::regclass[]) t;
select pgfence.protect('pt_ok', 'r', 'observe');  -- switching modes replaces the guard

drop trigger pgfence_guard on pt_dropped;
alter table pt_disabled disable trigger pgfence_guard;
alter table pt_replica enable replica trigger pgfence_guard;
alter trigger pgfence_guard on pt_renamed rename to something_else;
alter table pt_child inherit pt_parent;
create or replace trigger pgfence_guard after insert or update or delete or truncate on pt_args
  for each statement execute function pgfence.guard('s', 'enforce');
create or replace trigger pgfence_guard after truncate on pt_truncate_only
  for each statement execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard after insert or update or delete or truncate on pt_when_false
  for each statement when (false) execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard before insert or update or delete or truncate on pt_before
  for each statement execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard after insert or update or delete on pt_row
  for each row execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard after insert or update of id or delete or truncate on pt_update_of
  for each statement execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard after update or delete or truncate on pt_no_insert
  for each statement execute function pgfence.guard('r', 'enforce');
create or replace trigger pgfence_guard after insert or update or delete or truncate on pt_consumers_insert
  for each statement execute function pgfence.guard('r', 'enforce');

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
select is((select problem from pgfence.protected_tables where table_name = 'pt_truncate_only'),
          'the guard trigger does not fire for exactly insert, update, delete, truncate', 'a guard recreated AFTER TRUNCATE only');
select is((select problem from pgfence.protected_tables where table_name = 'pt_when_false'),
          'the guard trigger has a WHEN condition', 'a guard with WHEN (false)');
select is((select problem from pgfence.protected_tables where table_name = 'pt_before'),
          'the guard trigger does not fire after each statement', 'a guard recreated BEFORE');
select is((select problem from pgfence.protected_tables where table_name = 'pt_row'),
          'the guard trigger does not fire after each statement', 'a guard recreated FOR EACH ROW (no truncate)');
select is((select problem from pgfence.protected_tables where table_name = 'pt_update_of'),
          'the guard trigger fires only for updates of some columns', 'a guard recreated for UPDATE OF a column');
select is((select problem from pgfence.protected_tables where table_name = 'pt_no_insert'),
          'the guard trigger does not fire for exactly insert, update, delete, truncate', 'a guard recreated without insert');
select is((select (healthy, events) from pgfence.protected_tables where table_name = 'pt_consumers'),
          (true, '{update,delete,truncate}'::text[]), 'a consumers-only protection is healthy, and records its events');
select is((select problem from pgfence.protected_tables where table_name = 'pt_consumers_insert'),
          'the guard trigger does not fire for exactly update, delete, truncate',
          'a consumers-only protection whose guard fires for inserts too');
-- What the trigger does, not just that it exists: unfenced writes pass the crippled guards.
insert into pt_truncate_only values (1);
insert into pt_when_false values (1);
select is((select count(*) from pt_truncate_only) + (select count(*) from pt_when_false), 2::bigint,
          'unfenced inserts pass the guards reported unhealthy');
select is((select count(*) from pgfence.protected_tables where not healthy), 13::bigint, 'thirteen problems, no more');

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

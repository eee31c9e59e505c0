-- protect/unprotect: writes to a protected table need a fence of its resource in the same
-- transaction (enforce), or are recorded in pgfence.unfenced_writes (observe).
begin;
select plan(48);
select pgfence_test.reset();

create table public.audit (id int primary key, note text);
create table public.audit_observed (id int primary key, note text);
create table public.plain (id int primary key);
create view public.audit_view as select * from public.audit;

create temp table held on commit drop as
  select pgfence_test.lease('r', 'owner-r') as lease_id;
create temp table other on commit drop as
  select pgfence_test.lease('q', 'owner-q') as lease_id;

select lives_ok($$ select pgfence.protect('public.audit', 'r') $$, 'a table can be protected for a resource');

-- Unfenced writes are refused, whatever the statement.
select throws_ok($$ insert into public.audit values (1, 'unfenced') $$, 'PF007', null, 'an unfenced insert is refused');
select throws_ok($$ update public.audit set note = 'unfenced' $$, 'PF007', null, 'an unfenced update is refused');
select throws_ok($$ delete from public.audit $$, 'PF007', null, 'an unfenced delete is refused');
select throws_ok($$ truncate public.audit $$, 'PF007', null, 'an unfenced truncate is refused');

-- Fences that do not count.
select pgfence.fence(lease_id) from other;
select throws_ok($$ insert into public.audit values (1, 'fenced for q') $$, 'PF007', null,
                 'a fence of a different resource does not unlock the table');
select throws_ok(format('select pgfence.fence(%L)', gen_random_uuid()), 'PF001', null, 'a fence with an unknown lease fails');
select throws_ok($$ insert into public.audit values (1, 'failed fence') $$, 'PF007', null,
                 'a failed fence does not unlock the table');
savepoint before_fence;
select pgfence.fence(lease_id) from held;
rollback to savepoint before_fence;
select throws_ok($$ insert into public.audit values (1, 'rolled back fence') $$, 'PF007', null,
                 'a fence undone by rolling back to a savepoint does not unlock the table');
select is((select count(*) from public.audit), 0::bigint, 'no refused write left a row');

-- After fencing the resource's lease, every write works in the same transaction.
select lives_ok(format('select pgfence.fence(%L)', (select lease_id from held)), 'the resource''s current lease fences');
select lives_ok($$ insert into public.audit values (1, 'fenced') $$, 'a fenced insert works');
select lives_ok($$ update public.audit set note = 'fenced again' where id = 1 $$, 'a fenced update works');
select is((select note from public.audit where id = 1), 'fenced again', 'the fenced writes took effect');
select lives_ok($$ delete from public.audit where id = 1 $$, 'a fenced delete works');
select lives_ok($$ insert into public.audit values (2, 'fenced') $$, 'another fenced insert works');
select lives_ok($$ truncate public.audit $$, 'a fenced truncate works');
select is((select count(*) from public.audit), 0::bigint, 'the table is empty after the fenced truncate');
select is_empty($$ select id from pgfence.unfenced_writes where table_name = 'public.audit' $$,
                'an enforced table records nothing in unfenced_writes');

-- A statement may fence itself: the guard checks at the end of each statement.
create table public.ledger (generation bigint, note text);
create temp table held_l on commit drop as
  select pgfence_test.lease('l', 'owner-l') as lease_id;
select pgfence.protect('public.ledger', 'l');
select throws_ok($$ insert into public.ledger values (0, 'unfenced') $$, 'PF007', null,
                 'an unfenced insert into a table of another resource is refused');
select lives_ok($$ insert into public.ledger select pgfence.fence(lease_id), 'fenced in the statement' from held_l $$,
                'an insert that fences in the same statement works');
select results_eq($$ select generation, note from public.ledger $$,
                  $$ select l.generation, 'fenced in the statement'::text
                       from pgfence.leases l join held_l h using (lease_id) $$,
                  'its row carries the generation fence returned');
create table public.ledger_stale (generation bigint, note text);
create temp table stale_m on commit drop as
  select pgfence_test.superseded_lease('m') as lease_id;
select pgfence.protect('public.ledger_stale', 'm');
select throws_ok($$ insert into public.ledger_stale select pgfence.fence(lease_id), 'stale' from stale_m $$,
                 'PF001', null, 'an insert that fences a superseded lease in the same statement is refused');
select is((select count(*) from public.ledger_stale), 0::bigint, 'and wrote nothing');
select throws_ok($$ insert into public.ledger_stale select 1, 'fence of nothing' from stale_m where false $$,
                 'PF007', null, 'a statement whose fence never ran is refused, even with no rows');

-- Observe mode records unfenced writes instead of refusing them.
select pgfence.register('o');
select lives_ok($$ select pgfence.protect('public.audit_observed', 'o', 'observe') $$, 'a table can be protected in observe mode');
select lives_ok($$ insert into public.audit_observed values (1, 'unfenced') $$, 'an unfenced insert in observe mode works');
select is((select count(*) from public.audit_observed), 1::bigint, 'the row was written');
select results_eq($$ select table_name, resource, operation, mode from pgfence.unfenced_writes $$,
                  $$ values ('public.audit_observed'::text, 'o'::text, 'INSERT'::text, 'observe'::text) $$,
                  'the unfenced insert is recorded with its table, resource and operation');
select lives_ok($$ update public.audit_observed set note = 'still unfenced' $$, 'an unfenced update in observe mode works');
select is((select operation from pgfence.unfenced_writes order by id desc limit 1), 'UPDATE',
          'the unfenced update is recorded too');

-- Protecting again replaces the mode; unprotect removes the guard.
select lives_ok($$ select pgfence.protect('public.audit_observed', 'o', 'enforce') $$, 'protecting again switches to enforce');
select throws_ok($$ insert into public.audit_observed values (2, 'unfenced') $$, 'PF007', null,
                 'after switching to enforce an unfenced insert is refused');
select lives_ok($$ select pgfence.unprotect('public.audit_observed') $$, 'a table can be unprotected');
select lives_ok($$ insert into public.audit_observed values (3, 'unguarded') $$, 'after unprotect an unfenced insert works');
select lives_ok($$ select pgfence.unprotect('public.audit_observed') $$, 'unprotecting an unprotected table is fine');

-- A transaction that never fenced cannot pass for one that did. (Its own table and
-- resource: if the forged marker is accepted, it must not leak into the other tests.)
create table public.forged (id int primary key);
select pgfence.register('f');
select pgfence.protect('public.forged', 'f');
select throws_ok($$ select set_config('pgfence.fenced', E'\nf\n', true); insert into public.forged values (1) $$,
                 'PF007', null, 'setting the fence marker by hand does not unlock the table');
select throws_ok($$ select set_config('pgfence.fenced', E'\nf\n', false); insert into public.forged values (1) $$,
                 'PF007', null, 'nor does a session-level setting of it');

-- A statement guard on a parent does not see writes that name a child, so tables in a
-- partition or inheritance tree are refused rather than half-protected.
create table public.measurements (id int, at date) partition by range (at);
create table public.measurements_2024 partition of public.measurements for values from ('2024-01-01') to ('2025-01-01');
create table public.events (id int);
create table public.events_archive () inherits (public.events);
select throws_ok($$ select pgfence.protect('public.measurements', 'o') $$, '22023', null,
                 'a partitioned table cannot be protected');
select throws_ok($$ select pgfence.protect('public.measurements_2024', 'o') $$, '22023', null,
                 'a partition cannot be protected');
select throws_ok($$ select pgfence.protect('public.events', 'o') $$, '22023', null,
                 'a table with inheritance children cannot be protected');
select throws_ok($$ select pgfence.protect('public.events_archive', 'o') $$, '22023', null,
                 'an inheritance child cannot be protected');

-- What cannot be protected (for resource o, which nobody fenced here).
select throws_ok($$ select pgfence.protect('public.audit_view', 'o') $$, '22023', null, 'a view cannot be protected');
select throws_ok($$ select pgfence.protect('pgfence.resources', 'o') $$, '22023', null, 'a table of pgfence cannot be protected');
select throws_ok($$ select pgfence.protect('public.plain', 'unknown') $$, 'PF002', null,
                 'a table cannot be protected for an unknown resource');
select throws_ok($$ select pgfence.protect('public.plain', 'o', 'strict') $$, '22023', null, 'an unknown mode is refused');
select throws_ok($$ select pgfence.protect('public.plain', 'o', null) $$, '22023', null, 'a NULL mode is refused');
select lives_ok($$ insert into public.plain values (1) $$, 'the refused protections left the table unguarded');

select * from finish();
rollback;

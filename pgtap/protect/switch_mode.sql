-- An operator who may create triggers on a table but does not own it can switch its
-- protection's mode: protect replaces the guard (create or replace trigger) instead of
-- dropping it, which only the owner may do.
begin;
select plan(3);
select pgfence_test.reset();
select pgfence.register('r');
create role pgfence_test_trigger_only nologin in role pgfence_operator;
create table sm_rows (id int);
grant trigger on sm_rows to pgfence_test_trigger_only;
select pgfence.protect('sm_rows', 'r', 'observe');

set local role pgfence_test_trigger_only;
select lives_ok($$ select pgfence.protect('sm_rows', 'r', 'enforce') $$,
                'a role with TRIGGER on the table switches observe to enforce');
reset role;
select is((select mode from pgfence.protected_tables where table_name = 'sm_rows'), 'enforce', 'the mode is enforce');
select throws_ok($$ insert into sm_rows values (1) $$, 'PF007', null, 'and the guard enforces it');

select * from finish();
rollback;

-- unregister: the operator removes a resource nothing uses, with its ended history; refuses
-- (55000, naming it) while anything uses it; a name that comes back continues its generations
-- and none of the removed lease ids is valid again (I3). register is the operator's alone.
begin;
select plan(27);
select pgfence_test.reset();

select is(pgfence.unregister('never'), false, 'an unknown name: false (a retry is safe)');
select lives_ok($$ select pgfence.register('idle') $$, 'a resource nothing ever used');
select is(pgfence.unregister('idle'), true, 'is removed');
select is((select count(*) from pgfence.resource_status where resource = 'idle'), 0::bigint, 'and gone');
select throws_ok($$ select pgfence.unregister('a b') $$, '22023', null, 'a bad name is refused');

-- I3: generations never reused, lease ids never valid again, when a name comes back.
create temp table old as select pgfence_test.lease('r') as lease_id;
select pgfence.release(lease_id) from old;
create temp table gen as select max(generation) as g from pgfence.leases where resource = 'r';
select is(pgfence.unregister('r'), true, 'a resource whose lease ended is removed');
select is((select count(*) from pgfence.leases l, old where l.lease_id = old.lease_id), 0::bigint,
          'with its ended lease');
select lives_ok($$ select pgfence.register('r') $$, 'the name comes back');
create temp table again as select pgfence_test.lease('r') as lease_id;
select cmp_ok((select generation from pgfence.leases l, again where l.lease_id = again.lease_id), '>',
              (select g from gen), 'its next lease continues above every generation it had');
select throws_ok($$ select pgfence.renew(lease_id, '1 minute') from old $$, 'PF001', null,
                 'the removed lease cannot renew');
select throws_ok($$ select pgfence.fence(lease_id) from old $$, 'PF001', null, 'nor fence');
select throws_ok($$ select pgfence.release(lease_id) from old $$, 'PF001', null, 'nor release');
select is((select count(*) from pgfence.lease_status where resource = 'r' and status = 'current'), 1::bigint,
          'the new lease is the one current lease');

-- Refused while anything uses it; nothing removed.
select throws_ok($$ select pgfence.unregister('r') $$, '55000', null, 'an active lease: refused');
select throws_ok($$ select pgfence.unregister('r') $$, '55000',
                 'pgfence: resource r is in use: its lease of generation ' ||
                 (select generation from pgfence.leases l, again where l.lease_id = again.lease_id) || ' is active',
                 'naming the lease by its generation, never its id');
select pgfence.drain(lease_id) from again;
select throws_ok($$ select pgfence.unregister('r') $$, '55000', null, 'a draining lease: refused');
select pgfence_test.expire(lease_id) from again;
select pgfence.enqueue('q');
create temp table held as select pgfence_test.lease('r', 'held') as lease_id;
select pgfence.claim(lease_id, 'q') from held;
select pgfence_test.expire(lease_id) from held;
select throws_ok($$ select pgfence.unregister('r') $$, '55000',
                 'pgfence: resource r is in use: 1 task(s) or layer work not finished under its leases (generations ' ||
                 (select generation from pgfence.leases l, held where l.lease_id = held.lease_id) || ')',
                 'a task claimed under its expired lease: refused (a late result is judged against it)');
select lives_ok($$ select pgfence.requeue_expired() $$, 'requeued');
select throws_ok($$ select pgfence.unregister('r') $$, '55000', null,
                 'a queued task whose older attempt was claimed under it: refused (its stale result is verified against it)');
select pgfence.register('win');
select pgfence.prepare_update(array['win'], gen_random_uuid());
select throws_ok($$ select pgfence.unregister('win') $$, '55000', 'pgfence: resource win is in use: an open update window', 'an open window: refused');
select pgfence.register('inv');
select pgfence.request_start('inv');
select throws_ok($$ select pgfence.unregister('inv') $$, '55000', 'pgfence: resource inv is in use: 1 pending invocation(s)', 'a pending start: refused');
select pgfence.register('prot');
create table pg_temp.guarded (id int);
select pgfence.protect('pg_temp.guarded', 'prot');
select throws_ok($$ select pgfence.unregister('prot') $$, '55000', 'pgfence: resource prot is in use: protections of guarded', 'a protection: refused');
select is((select count(*) from pgfence.resources where resource in ('r', 'win', 'inv', 'prot')), 4::bigint,
          'nothing was removed');

-- Who may: the operator registers and unregisters, a worker neither.
select function_privs_are('pgfence', 'unregister', array['text'], 'pgfence_operator', array['EXECUTE'],
                          'an operator can unregister');
select function_privs_are('pgfence', 'unregister', array['text'], 'pgfence_worker', array[]::text[],
                          'a worker cannot unregister');
select function_privs_are('pgfence', 'register', array['text', 'boolean'], 'pgfence_operator', array['EXECUTE'],
                          'an operator can register');
select function_privs_are('pgfence', 'register', array['text', 'boolean'], 'pgfence_worker', array[]::text[],
                          'a worker cannot register');

select * from finish();
rollback;

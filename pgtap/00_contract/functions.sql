-- The SQL API as the contract names it (core, startup handshake, tasks, updates): signatures, return types, who
-- runs as whom, who may execute what, and a pinned search_path on every definer.
begin;
select plan(106);
select pgfence_test.reset();

-- Signatures, with the exact argument types of the contract.
select has_function('pgfence', 'register', array['text', 'boolean'], 'register(text, boolean) exists');
select has_function('pgfence', 'set_enabled', array['text', 'boolean'], 'set_enabled(text, boolean) exists');
select has_function('pgfence', 'deprecate', array['text'], 'deprecate(text) exists');
select has_function('pgfence', 'acquire', array['text', 'text', 'interval', 'uuid'], 'acquire(text, text, interval, uuid) exists');
select has_function('pgfence', 'renew', array['uuid', 'interval'], 'renew(uuid, interval) exists');
select has_function('pgfence', 'drain', array['uuid'], 'drain(uuid) exists');
select has_function('pgfence', 'release', array['uuid'], 'release(uuid) exists');
select has_function('pgfence', 'fence', array['uuid'], 'fence(uuid) exists');
select has_function('pgfence', 'protect', array['regclass', 'text', 'text'], 'protect(regclass, text, text) exists');
select has_function('pgfence', 'unprotect', array['regclass'], 'unprotect(regclass) exists');
select has_function('pgfence', 'request_start', array['text', 'interval'], 'request_start(text, interval) exists');
select has_function('pgfence', 'enqueue', array['text', 'jsonb', 'integer'], 'enqueue(text, jsonb, integer) exists');
select has_function('pgfence', 'claim', array['uuid', 'text', 'integer', 'interval'], 'claim(uuid, text, integer, interval) exists');
select has_function('pgfence', 'complete', array['uuid', 'jsonb'], 'complete(uuid, jsonb) exists');
select has_function('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'complete_many(uuid[], jsonb[]) exists');
select has_function('pgfence', 'fail', array['uuid', 'jsonb'], 'fail(uuid, jsonb) exists');
select has_function('pgfence', 'extend', array['uuid', 'interval'], 'extend(uuid, interval) exists');
select has_function('pgfence', 'requeue_expired', array['integer'], 'requeue_expired(integer) exists');
select has_function('pgfence', 'prepare_update', array['text[]', 'uuid'], 'prepare_update(text[], uuid) exists');
select has_function('pgfence', 'update_status', array['uuid'], 'update_status(uuid) exists');
select has_function('pgfence', 'finish_update', array['uuid'], 'finish_update(uuid) exists');

-- Return types.
select function_returns('pgfence', 'register', array['text', 'boolean'], 'void', 'register returns nothing');
select function_returns('pgfence', 'set_enabled', array['text', 'boolean'], 'boolean', 'set_enabled returns the previous value as boolean');
select function_returns('pgfence', 'deprecate', array['text'], 'uuid', 'deprecate returns a lease id');
select function_returns('pgfence', 'acquire', array['text', 'text', 'interval', 'uuid'], 'pgfence.lease', 'acquire returns a pgfence.lease');
select function_returns('pgfence', 'renew', array['uuid', 'interval'], 'record', 'renew returns a record (expires_at, state)');
select function_returns('pgfence', 'drain', array['uuid'], 'text', 'drain returns the state as text');
select function_returns('pgfence', 'release', array['uuid'], 'boolean', 'release returns whether this call ended the lease');
select function_returns('pgfence', 'fence', array['uuid'], 'bigint', 'fence returns the generation as bigint');
select function_returns('pgfence', 'protect', array['regclass', 'text', 'text'], 'void', 'protect returns nothing');
select function_returns('pgfence', 'unprotect', array['regclass'], 'void', 'unprotect returns nothing');
select function_returns('pgfence', 'request_start', array['text', 'interval'], 'uuid', 'request_start returns an invocation id');
select function_returns('pgfence', 'enqueue', array['text', 'jsonb', 'integer'], 'bigint', 'enqueue returns the task id as bigint');
select function_returns('pgfence', 'claim', array['uuid', 'text', 'integer', 'interval'], 'setof record',
                        'claim returns a set of rows (task_id, attempt_id, attempt, payload)');
select function_returns('pgfence', 'complete', array['uuid', 'jsonb'], 'text', 'complete returns the outcome as text');
select function_returns('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'setof record',
                        'complete_many returns a set of rows (attempt_id, outcome)');
select function_returns('pgfence', 'fail', array['uuid', 'jsonb'], 'text', 'fail returns the outcome as text');
select function_returns('pgfence', 'extend', array['uuid', 'interval'], 'timestamp with time zone',
                        'extend returns the new visible_until as timestamptz');
select function_returns('pgfence', 'requeue_expired', array['integer'], 'integer', 'requeue_expired returns a count as integer');
select function_returns('pgfence', 'prepare_update', array['text[]', 'uuid'], 'uuid', 'prepare_update returns the update token as uuid');
select function_returns('pgfence', 'update_status', array['uuid'], 'setof record',
                        'update_status returns a set of rows, one per resource');
select function_returns('pgfence', 'finish_update', array['uuid'], 'setof record',
                        'finish_update returns a set of rows (resource, enabled, outcome)');

-- renew's record has the two columns the contract names, in that order.
select is((select array_agg(a order by o)
             from pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) with ordinality as u(a, m, o)
            where p.oid = 'pgfence.renew(uuid, interval)'::regprocedure and m = 'o'),
          array['expires_at', 'state']::text[],
          'renew returns expires_at and state');

-- claim's rows have the four columns the contract names, in that order.
select is((select array_agg(a order by o)
             from pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) with ordinality as u(a, m, o)
            where p.oid = 'pgfence.claim(uuid, text, integer, interval)'::regprocedure and m = 't'),
          array['task_id', 'attempt_id', 'attempt', 'payload']::text[],
          'claim returns task_id, attempt_id, attempt and payload');

-- complete_many's rows have the two columns the contract names, in that order.
select is((select array_agg(a order by o)
             from pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) with ordinality as u(a, m, o)
            where p.oid = 'pgfence.complete_many(uuid[], jsonb[])'::regprocedure and m = 't'),
          array['attempt_id', 'outcome']::text[],
          'complete_many returns attempt_id and outcome');

-- update_status's rows have the columns the contract names, in that order.
select is((select array_agg(a order by o)
             from pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) with ordinality as u(a, m, o)
            where p.oid = 'pgfence.update_status(uuid)'::regprocedure and m = 't'),
          array['resource', 'saved_enabled', 'enabled', 'active_owner', 'draining_leases', 'in_flight_tasks',
                'pending_invocations', 'verdict', 'last_heartbeat', 'in_flight', 'unfenced_writes', 'workers']::text[],
          'update_status returns resource, saved_enabled, enabled, active_owner, draining_leases, in_flight_tasks, '
          'pending_invocations, verdict, last_heartbeat, in_flight, unfenced_writes and workers');

-- finish_update's rows have the three columns the contract names, in that order.
select is((select array_agg(a order by o)
             from pg_catalog.pg_proc p,
                  unnest(p.proargnames, p.proargmodes::text[]) with ordinality as u(a, m, o)
            where p.oid = 'pgfence.finish_update(uuid)'::regprocedure and m = 't'),
          array['resource', 'enabled', 'outcome']::text[],
          'finish_update returns resource, enabled and outcome');

-- Who runs as whom: the callers must not touch the tables, so the API runs as its owner;
-- protect and unprotect create and drop triggers with the caller's own privileges.
select is_definer('pgfence', 'register', array['text', 'boolean'], 'register runs as its owner');
select is_definer('pgfence', 'set_enabled', array['text', 'boolean'], 'set_enabled runs as its owner');
select is_definer('pgfence', 'deprecate', array['text'], 'deprecate runs as its owner');
select is_definer('pgfence', 'acquire', array['text', 'text', 'interval', 'uuid'], 'acquire runs as its owner');
select is_definer('pgfence', 'renew', array['uuid', 'interval'], 'renew runs as its owner');
select is_definer('pgfence', 'drain', array['uuid'], 'drain runs as its owner');
select is_definer('pgfence', 'release', array['uuid'], 'release runs as its owner');
select is_definer('pgfence', 'fence', array['uuid'], 'fence runs as its owner');
select is_definer('pgfence', 'request_start', array['text', 'interval'], 'request_start runs as its owner');
select is_definer('pgfence', 'enqueue', array['text', 'jsonb', 'integer'], 'enqueue runs as its owner');
select is_definer('pgfence', 'claim', array['uuid', 'text', 'integer', 'interval'], 'claim runs as its owner');
select is_definer('pgfence', 'complete', array['uuid', 'jsonb'], 'complete runs as its owner');
select is_definer('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'complete_many runs as its owner');
select is_definer('pgfence', 'fail', array['uuid', 'jsonb'], 'fail runs as its owner');
select is_definer('pgfence', 'extend', array['uuid', 'interval'], 'extend runs as its owner');
select is_definer('pgfence', 'requeue_expired', array['integer'], 'requeue_expired runs as its owner');
select is_definer('pgfence', 'prepare_update', array['text[]', 'uuid'], 'prepare_update runs as its owner');
select is_definer('pgfence', 'update_status', array['uuid'], 'update_status runs as its owner');
select is_definer('pgfence', 'finish_update', array['uuid'], 'finish_update runs as its owner');
select isnt_definer('pgfence', 'protect', array['regclass', 'text', 'text'], 'protect runs as the caller');
select isnt_definer('pgfence', 'unprotect', array['regclass'], 'unprotect runs as the caller');

-- Nobody gets anything by default.
select is_empty($$ select p.oid::regprocedure::text
                     from pg_catalog.pg_proc p
                    where p.pronamespace = 'pgfence'::regnamespace
                      and has_function_privilege('public', p.oid, 'execute') $$,
                'no function in schema pgfence is executable by PUBLIC');

select is_empty($$ select p.oid::regprocedure::text
                     from pg_catalog.pg_proc p
                    where p.pronamespace = 'pgfence'::regnamespace
                      and p.prosecdef
                      and not exists (select from unnest(p.proconfig) c where c like 'search_path=%') $$,
                'every security definer function in schema pgfence pins search_path');

-- Every contract function states its contract in a comment.
select is_empty($$ select f::text
                     from unnest(array['pgfence.register(text, boolean)',
                                       'pgfence.set_enabled(text, boolean)',
                                       'pgfence.deprecate(text)',
                                       'pgfence.acquire(text, text, interval, uuid)',
                                       'pgfence.renew(uuid, interval)',
                                       'pgfence.drain(uuid)',
                                       'pgfence.release(uuid)',
                                       'pgfence.fence(uuid)',
                                       'pgfence.protect(regclass, text, text)',
                                       'pgfence.unprotect(regclass)',
                                       'pgfence.request_start(text, interval)',
                                       'pgfence.enqueue(text, jsonb, integer)',
                                       'pgfence.claim(uuid, text, integer, interval)',
                                       'pgfence.complete(uuid, jsonb)',
                                       'pgfence.complete_many(uuid[], jsonb[])',
                                       'pgfence.fail(uuid, jsonb)',
                                       'pgfence.extend(uuid, interval)',
                                       'pgfence.requeue_expired(integer)',
                                       'pgfence.prepare_update(text[], uuid)',
                                       'pgfence.update_status(uuid)',
                                       'pgfence.finish_update(uuid)',
                                       'pgfence.prune(interval)',
                                       'pgfence.health()',
                                       'pgfence.unregister(text)']::regprocedure[]) as f
                    where coalesce(obj_description(f, 'pg_proc'), '') = '' $$,
                'every contract function has a comment');

-- Key grants.
select function_privs_are('pgfence', 'acquire', array['text', 'text', 'interval', 'uuid'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can acquire');
select function_privs_are('pgfence', 'renew', array['uuid', 'interval'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can renew');
select function_privs_are('pgfence', 'drain', array['uuid'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can drain');
select function_privs_are('pgfence', 'release', array['uuid'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can release');
select function_privs_are('pgfence', 'fence', array['uuid'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can fence');
select function_privs_are('pgfence', 'request_start', array['text', 'interval'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can request a start');
select function_privs_are('pgfence', 'claim', array['uuid', 'text', 'integer', 'interval'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can claim');
select function_privs_are('pgfence', 'complete', array['uuid', 'jsonb'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can complete');
select function_privs_are('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can complete a batch');
select function_privs_are('pgfence', 'complete_many', array['uuid[]', 'jsonb[]'], 'pgfence_monitor',
                          array[]::text[], 'a monitor cannot complete a batch');
select function_privs_are('pgfence', 'fail', array['uuid', 'jsonb'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can fail');
select function_privs_are('pgfence', 'extend', array['uuid', 'interval'], 'pgfence_worker',
                          array['EXECUTE'], 'a worker can extend');
select function_privs_are('pgfence', 'acquire', array['text', 'text', 'interval', 'uuid'], 'pgfence_monitor',
                          array[]::text[], 'a monitor cannot acquire');
select function_privs_are('pgfence', 'claim', array['uuid', 'text', 'integer', 'interval'], 'pgfence_monitor',
                          array[]::text[], 'a monitor cannot claim');
select function_privs_are('pgfence', 'set_enabled', array['text', 'boolean'], 'pgfence_operator',
                          array['EXECUTE'], 'an operator can enable and disable');
select function_privs_are('pgfence', 'set_enabled', array['text', 'boolean'], 'pgfence_worker',
                          array[]::text[], 'a worker cannot enable or disable');
select function_privs_are('pgfence', 'prepare_update', array['text[]', 'uuid'], 'pgfence_operator',
                          array['EXECUTE'], 'an operator can prepare an update');
select function_privs_are('pgfence', 'update_status', array['uuid'], 'pgfence_operator',
                          array['EXECUTE'], 'an operator can read an update''s status');
select function_privs_are('pgfence', 'finish_update', array['uuid'], 'pgfence_operator',
                          array['EXECUTE'], 'an operator can finish an update');
select function_privs_are('pgfence', 'update_status', array['uuid'], 'pgfence_monitor',
                          array['EXECUTE'], 'a monitor can read an update''s status');
select function_privs_are('pgfence', 'prepare_update', array['text[]', 'uuid'], 'pgfence_monitor',
                          array[]::text[], 'a monitor cannot prepare an update');
select function_privs_are('pgfence', 'finish_update', array['uuid'], 'pgfence_monitor',
                          array[]::text[], 'a monitor cannot finish an update');
select function_privs_are('pgfence', 'prepare_update', array['text[]', 'uuid'], 'pgfence_worker',
                          array[]::text[], 'a worker cannot prepare an update');
select function_privs_are('pgfence', 'update_status', array['uuid'], 'pgfence_worker',
                          array[]::text[], 'a worker cannot read an update''s status');
select function_privs_are('pgfence', 'finish_update', array['uuid'], 'pgfence_worker',
                          array[]::text[], 'a worker cannot finish an update');

-- Retention and health (0.2.0): prune(older_than interval default '7 days') returns (what, rows),
-- operator; health() returns ("check", ok, detail), monitor; both definers.
select has_function('pgfence', 'prune', array['interval'], 'prune(interval) exists');
select has_function('pgfence', 'health', array[]::text[], 'health() exists');
select is((select pg_get_function_result('pgfence.prune(interval)'::regprocedure)),
          'TABLE(what text, rows bigint)', 'prune returns (what text, rows bigint)');
select is((select pg_get_function_result('pgfence.health()'::regprocedure)),
          'TABLE("check" text, ok boolean, detail text)', 'health returns ("check" text, ok boolean, detail text)');
select is((select pg_get_function_arguments('pgfence.prune(interval)'::regprocedure)),
          'older_than interval DEFAULT ''7 days''::interval', 'prune''s bound defaults to 7 days');
select is_definer('pgfence', 'prune', array['interval'], 'prune runs as its owner');
select is_definer('pgfence', 'health', array[]::text[], 'health runs as its owner');
select function_privs_are('pgfence', 'prune', array['interval'], 'pgfence_operator', array['EXECUTE'],
                          'an operator can prune');
select function_privs_are('pgfence', 'health', array[]::text[], 'pgfence_monitor', array['EXECUTE'],
                          'a monitor can run the health checks');
select function_privs_are('pgfence', 'prune', array['interval'], 'pgfence_monitor', array[]::text[],
                          'a monitor cannot prune');

select * from finish();
rollback;

-- Deploy pgfence:kinds
-- requires: releases
--
-- The kind of every pgfence function that is not the API (the API is what a pgfence role may
-- execute), as the first word of its comment: Layers (the layers call it: their API, as
-- stable as the API), Installer (releases, upgrades and the CLI call it), Private (a helper of
-- this schema, free to change). The layers mark theirs (Hook, Private) with pgfence.set_kind
-- in their own kinds change. tests/test_function_kinds.py holds each kind to the facts.
-- A new function that is not the API is added to the list of its kind here (rework kinds).
--
-- Reworked in 0.3.1, unchanged, to follow layer_api's rework: a fresh install creates the
-- layers' functions there, and their comments, written again by it, get their kind here.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.set_kind(kind text, variadic functions regprocedure[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  f regprocedure;
  v_comment text;
begin
  if kind is not null and kind not in ('Layers', 'Installer', 'Hook', 'Private') then
    perform pgfence.invalid_argument('kind', 'Layers, Installer, Hook, Private or NULL', kind);
  end if;
  foreach f in array coalesce(functions, array[]::regprocedure[]) loop
    -- Any kind it had goes first, so that marking again or with NULL (a revert) leaves one.
    v_comment := regexp_replace(coalesce(obj_description(f, 'pg_proc'), ''),
                                '^(Layers|Installer|Hook|Private):\s*', '');
    if kind is not null then
      v_comment := kind || ':' || case when v_comment = '' then '' else ' ' || v_comment end;
    end if;
    execute format('comment on function %s is %L', f, nullif(v_comment, ''));
  end loop;
end
$$;
revoke all on function pgfence.set_kind(text, regprocedure[]) from public;

do $$
begin
  perform pgfence.set_kind('Installer', 'pgfence.set_kind(text, regprocedure[])',
      'pgfence.installed_release(name)', 'pgfence.schema_drift(name)',
      'pgfence.schema_fingerprint(name)');
  perform pgfence.set_kind('Layers',
      'pgfence.attempt_of(uuid)', 'pgfence.attempt_uuid(bigint, integer, uuid)',
      'pgfence.attempt_uuid(bigint, integer, uuid, bytea)', 'pgfence.check_batch(uuid[])',
      'pgfence.check_interval(text, interval)', 'pgfence.cron_job_problem(regprocedure)',
      'pgfence.hold_fenced(uuid)', 'pgfence.invoker()', 'pgfence.limit_idle()',
      'pgfence.limit_lock_wait()', 'pgfence.mark_guards(regclass[])',
      'pgfence.mark_lease(uuid, regclass)', 'pgfence.owner_ref(uuid, text)',
      'pgfence.prune_attempts(regclass, regclass, name, interval, uuid[])');
  perform pgfence.set_kind('Private',
      'pgfence.acl_text(aclitem[], "char", oid, oid)',
      'pgfence.attempt_holds(bigint, integer, uuid, boolean, bytea, uuid)',
      'pgfence.attempt_signed(uuid, bigint, integer, uuid)', 'pgfence.attempt_task(uuid)',
      'pgfence.attempt_uuid_0_1(bigint, integer, uuid, bytea)', 'pgfence.check_label(text, text)',
      'pgfence.deparsed(text)', 'pgfence.enabled_changed(text[])', 'pgfence.fence_token(text, bytea)',
      'pgfence.fold_tallies()', 'pgfence.foreign_grants(name)', 'pgfence.health_checks()',
      'pgfence.hmac(text, bytea)', 'pgfence.hold_current(uuid)', 'pgfence.interval_ok(interval)',
      'pgfence.is_live(text, timestamp with time zone)', 'pgfence.layer_window(uuid, text[])',
      'pgfence.lease_not_current(uuid, timestamp with time zone)', 'pgfence.lock_resources(text[])',
      'pgfence.mark_fenced(text, bytea)', 'pgfence.report(uuid, text, jsonb)',
      'pgfence.schema_objects(name)', 'pgfence.sign(text, bytea)', 'pgfence.unknown_attempt(uuid)',
      'pgfence.update_not_found(uuid)');
end
$$;

commit;

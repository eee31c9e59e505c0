-- Deploy pgfence:protect
-- requires: hmac
-- requires: protections
-- requires: fence
-- requires: unfenced_writes
-- requires: resources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Statement-level: the check costs one marker comparison per statement, not a lookup per
-- row, and the lock that fence() holds keeps its answer true until commit. It runs AFTER the
-- statement, so that a statement may fence itself (insert ... select pgfence.fence($1), ...):
-- a fenced write in one round trip. A refused statement is undone whole.
-- Arguments: the resources (a fence of any one of them admits the write), then the mode. A
-- guard of release 0.1.0 has the same shape with one resource.
create or replace function pgfence.guard()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_markers text := coalesce(current_setting('pgfence.fenced', true), '');
  v_key bytea;
  v_mode text := tg_argv[tg_nargs - 1];
begin
  if v_markers <> '' then
    select k.hmac_key into v_key from pgfence.signing_key k;
    for i in 0 .. tg_nargs - 2 loop
      if strpos(v_markers, E'\n' || pgfence.fence_token(tg_argv[i], v_key) || E'\n') > 0 then
        return null;
      end if;
    end loop;
  end if;
  if v_mode = 'observe' then
    insert into pgfence.unfenced_writes (table_name, resource, operation, mode, transaction_id, role_name, application_name)
    values (format('%I.%I', tg_table_schema, tg_table_name), array_to_string(tg_argv[0:tg_nargs - 2], ','),
            tg_op, v_mode, pg_current_xact_id(), session_user, current_setting('application_name', true));
    return null;
  end if;
  raise exception 'pgfence: unfenced % on %.%, which is protected for resource %',
                  tg_op, tg_table_schema, tg_table_name, array_to_string(tg_argv[0:tg_nargs - 2], ' or ')
    using errcode = 'PF007',
          hint = 'call pgfence.fence(lease_id) for that resource earlier in the same transaction';
end
$$;
comment on function pgfence.guard() is
  'Trigger of protected tables: rejects (enforce) or records (observe) a write in a transaction that has fenced none of its resources.';

create or replace function pgfence.protect(tbl regclass, resources text[], mode text default 'enforce',
                                           consumers_only boolean default false)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_resources text[];
  v_unknown text[];
  v_renamed name;
  v_events text := 'insert or update or delete or truncate';
begin
  perform pgfence.check_not_null('tbl', protect.tbl);
  perform pgfence.check_not_null('consumers_only', protect.consumers_only);
  if protect.resources is null or cardinality(protect.resources) not between 1 and 100
     or array_position(protect.resources, null) is not null then
    perform pgfence.invalid_argument('resources', 'must be 1 to 100 resource names, none of them NULL',
                                     protect.resources::text);
  end if;
  for i in 1 .. cardinality(protect.resources) loop
    perform pgfence.check_name('resources', protect.resources[i]);
  end loop;
  v_resources := array(select distinct r from unnest(protect.resources) r order by r);
  if protect.mode is null or protect.mode not in ('enforce', 'observe') then
    perform pgfence.invalid_argument('mode', 'must be enforce or observe', protect.mode);
  end if;
  -- A statement trigger fires only for statements that name its own table, so a write that
  -- names a partition or an inheritance child would pass a guard on the parent unseen.
  if (select c.relkind <> 'r' or c.relispartition from pg_catalog.pg_class c where c.oid = protect.tbl)
     or exists (select from pg_catalog.pg_inherits i
                 where i.inhrelid = protect.tbl or i.inhparent = protect.tbl) then
    perform pgfence.invalid_argument('tbl',
      'must be a plain table: not a view, partitioned table, partition or member of an inheritance tree',
      protect.tbl::text);
  end if;
  if (select c.relnamespace from pg_catalog.pg_class c where c.oid = protect.tbl) = 'pgfence'::regnamespace then
    perform pgfence.invalid_argument('tbl', 'must not be a table of pgfence itself', protect.tbl::text);
  end if;
  v_unknown := array(select r from unnest(v_resources) r
                      where not exists (select from pgfence.resources x where x.resource = r));
  if cardinality(v_unknown) > 0 then
    perform pgfence.resource_not_found(array_to_string(v_unknown, ', '));
  end if;
  -- A queue whose producers insert without a lease (pgmq.send, pgflow.start_flow) is guarded
  -- where its consumers write: update, delete, truncate. The layers protect theirs so.
  if protect.consumers_only then
    v_events := 'update or delete or truncate';
  end if;
  -- Runs as the caller: creating a trigger needs the caller's own TRIGGER privilege on tbl,
  -- and replacing it (to switch modes) no more than that, where dropping it would need
  -- ownership. The guard is found by its function, so one renamed by hand is replaced, not
  -- doubled.
  for v_renamed in
    select t.tgname from pg_catalog.pg_trigger t
     where t.tgrelid = protect.tbl and t.tgfoid = 'pgfence.guard()'::regprocedure
       and t.tgname <> 'pgfence_guard'
  loop
    execute format('drop trigger %I on %s', v_renamed, protect.tbl);
  end loop;
  execute format('create or replace trigger pgfence_guard after %s on %s '
                 'for each statement execute function pgfence.guard(%s)',
                 v_events, protect.tbl,
                 (select string_agg(quote_literal(a), ', ') from unnest(v_resources || protect.mode) a));
  insert into pgfence.protections as p (tbl, resources, mode, events)
  values (protect.tbl, v_resources, protect.mode,
          case when protect.consumers_only then '{update,delete,truncate}'::text[]
               else '{insert,update,delete,truncate}' end)
  on conflict on constraint protections_pkey
  do update set resources = excluded.resources, mode = excluded.mode, events = excluded.events,
                protected_at = clock_timestamp();
end
$$;
comment on function pgfence.protect(regclass, text[], text, boolean) is
  'Operator: writes to tbl are rejected with PF007 (enforce) or recorded in pgfence.unfenced_writes (observe) '
  'unless the transaction fenced one of resources (replicas that serve one queue). consumers_only: inserts pass '
  '(a queue''s producers), updates, deletes and truncates are guarded. Replaces an earlier protection of tbl. '
  'Raises PF002, 22023.';

create or replace function pgfence.protect(tbl regclass, resource text, mode text default 'enforce')
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_name('resource', protect.resource);
  perform pgfence.protect(protect.tbl, array[protect.resource], protect.mode);
end
$$;
comment on function pgfence.protect(regclass, text, text) is
  'Operator: writes to tbl are rejected with PF007 (enforce) or recorded in pgfence.unfenced_writes (observe) '
  'unless the transaction fenced resource. Replaces an earlier protection of tbl. Raises PF002, 22023.';

create or replace function pgfence.unprotect(tbl regclass)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_guard name;
begin
  perform pgfence.check_not_null('tbl', unprotect.tbl);
  -- Every guard of tbl, found by its function (also one renamed by hand).
  for v_guard in
    select t.tgname from pg_catalog.pg_trigger t
     where t.tgrelid = unprotect.tbl and t.tgfoid = 'pgfence.guard()'::regprocedure
  loop
    execute format('drop trigger %I on %s', v_guard, unprotect.tbl);
  end loop;
  delete from pgfence.protections p where p.tbl = unprotect.tbl;
end
$$;
comment on function pgfence.unprotect(regclass) is 'Operator: removes the protection of tbl, if any: its guard (whatever it is named now) and its record.';

revoke all on function pgfence.guard() from public;
revoke all on function pgfence.protect(regclass, text, text) from public;
revoke all on function pgfence.protect(regclass, text[], text, boolean) from public;
revoke all on function pgfence.unprotect(regclass) from public;
-- protect runs as the operator, who needs the guard (to create the trigger) and a look at
-- the registered names; firing the trigger later needs no privilege of the writer.
grant execute on function pgfence.guard() to pgfence_operator;
grant execute on function pgfence.protect(regclass, text, text), pgfence.protect(regclass, text[], text, boolean),
                         pgfence.unprotect(regclass)
   to pgfence_operator;

commit;

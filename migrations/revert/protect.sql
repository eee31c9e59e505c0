-- Revert pgfence:protect: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Release 0.1.0's guard knows one resource per table.
do $$
begin
  if exists (select from pgfence.protections p where cardinality(p.resources) > 1) then
    raise exception 'pgfence: tables are protected for several resources; protect them for one first'
      using errcode = '55000';
  end if;
end
$$;
drop function pgfence.protect(regclass, text[], text, boolean);

-- Statement-level: the check costs one marker comparison per statement, not a lookup per
-- row, and the lock that fence() holds keeps its answer true until commit. It runs AFTER the
-- statement, so that a statement may fence itself (insert ... select pgfence.fence($1), ...):
-- a fenced write in one round trip. A refused statement is undone whole.
create or replace function pgfence.guard()
returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from pgfence.signing_key k
              where strpos(coalesce(current_setting('pgfence.fenced', true), ''),
                           E'\n' || pgfence.fence_token(tg_argv[0], k.key) || E'\n') > 0) then
    return null;
  end if;
  if tg_argv[1] = 'observe' then
    insert into pgfence.unfenced_writes (table_name, resource, operation, mode, transaction_id, role_name, application_name)
    values (format('%I.%I', tg_table_schema, tg_table_name), tg_argv[0], tg_op, tg_argv[1],
            pg_current_xact_id(), session_user, current_setting('application_name', true));
    return null;
  end if;
  raise exception 'pgfence: unfenced % on %.%, which is protected for resource %',
                  tg_op, tg_table_schema, tg_table_name, tg_argv[0]
    using errcode = 'PF007',
          hint = 'call pgfence.fence(lease_id) for that resource earlier in the same transaction';
end
$$;
comment on function pgfence.guard() is
  'Trigger of protected tables: rejects (enforce) or records (observe) a write in a transaction that has not fenced the resource.';

create or replace function pgfence.protect(tbl regclass, resource text, mode text default 'enforce')
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  perform pgfence.check_not_null('tbl', protect.tbl);
  perform pgfence.check_name('resource', protect.resource);
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
  if not exists (select from pgfence.resources r where r.resource = protect.resource) then
    perform pgfence.resource_not_found(protect.resource);
  end if;
  -- Runs as the caller: creating a trigger needs the caller's own TRIGGER privilege on tbl.
  perform pgfence.unprotect(protect.tbl);
  execute format('create trigger pgfence_guard after insert or update or delete or truncate on %s '
                 'for each statement execute function pgfence.guard(%L, %L)',
                 protect.tbl, protect.resource, protect.mode);
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
begin
  perform pgfence.check_not_null('tbl', unprotect.tbl);
  if exists (select from pg_catalog.pg_trigger t
              where t.tgrelid = unprotect.tbl and t.tgname = 'pgfence_guard') then
    execute format('drop trigger pgfence_guard on %s', unprotect.tbl);
  end if;
end
$$;
comment on function pgfence.unprotect(regclass) is 'Operator: removes the protection of tbl, if any.';

revoke all on function pgfence.guard() from public;
revoke all on function pgfence.protect(regclass, text, text) from public;
revoke all on function pgfence.unprotect(regclass) from public;
-- protect runs as the operator, who needs the guard (to create the trigger) and a look at
-- the registered names; firing the trigger later needs no privilege of the writer.
grant execute on function pgfence.guard() to pgfence_operator;
grant execute on function pgfence.protect(regclass, text, text), pgfence.unprotect(regclass) to pgfence_operator;

commit;

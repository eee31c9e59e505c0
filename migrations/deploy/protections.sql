-- Deploy pgfence:protections
-- requires: resources

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- What protect was asked to protect, kept apart from the guard trigger it creates, so that a
-- guard dropped, disabled or renamed by hand, or a table moved into an inheritance or partition
-- tree afterwards, shows up in pgfence.protected_tables instead of silently protecting nothing.
create table pgfence.protections (
  tbl          regclass primary key,            -- follows renames; dumps and restores by name
  resources    text[] not null,                 -- a write needs a fence of any one of them
  mode         text not null check (mode in ('enforce', 'observe')),
  -- The writes the guard covers: every kind, or (protect's consumers_only) all but insert, for
  -- a queue table whose producers insert without a lease. protected_tables checks the trigger
  -- against exactly these.
  events       text[] not null default '{insert,update,delete,truncate}'
               check (events in ('{insert,update,delete,truncate}', '{update,delete,truncate}')),
  protected_at timestamptz not null default clock_timestamp()
);
comment on table pgfence.protections is 'Tables protect was asked to protect. Not a public interface: see pgfence.protected_tables.';

-- Tables protected before this table existed (release 0.1.0): from their guards' arguments.
-- (On a fresh install there is no guard function yet, nor a protected table.)
insert into pgfence.protections (tbl, resources, mode)
select t.tgrelid::regclass, array[a[1]], a[2]
  from pg_catalog.pg_trigger t,
       -- tgargs: each argument followed by a NUL, which the escape format writes as \000.
       lateral (select pg_catalog.string_to_array(pg_catalog.encode(t.tgargs, 'escape'), '\000') as a) x
 where t.tgfoid = pg_catalog.to_regprocedure('pgfence.guard()') and t.tgname = 'pgfence_guard'
on conflict do nothing;

revoke all on table pgfence.protections from public;
-- protect and unprotect run as the operator.
grant select, insert, update, delete on table pgfence.protections to pgfence_operator;

commit;

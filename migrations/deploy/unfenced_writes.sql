-- Deploy pgfence:unfenced_writes
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create table pgfence.unfenced_writes (
  id               bigint generated always as identity primary key,
  table_name       text not null,
  resource         text not null,
  operation        text not null,
  mode             text not null,
  transaction_id   xid8 not null,
  role_name        name not null,
  application_name text,
  at               timestamptz not null default clock_timestamp()
);
comment on table pgfence.unfenced_writes is
  'Writes to tables protected in observe mode by transactions that did not fence their resource: '
  'the writers still to be moved onto pgfence before switching to enforce.';

revoke all on table pgfence.unfenced_writes from public;
grant select on table pgfence.unfenced_writes to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence_pgmq:schema
--
-- pgfence's optional pgmq layer: fenced reads and results over pgmq queues, in schema
-- pgfence_pgmq. Installed after pgmq and pgfence, never needed by either.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  if pg_catalog.to_regprocedure('pgfence.lockdown(name)') is null
     or pg_catalog.to_regclass('pgfence.layers') is null then
    raise exception 'pgfence pgmq layer: needs pgfence 0.2.0 or later installed first'
      using errcode = '55000', hint = 'install sql/pgfence.sql (or upgrade), then this file';
  end if;
  -- pgmq 1.5 is the first whose queues all have the columns used here (headers came last);
  -- later releases keep them.
  if pg_catalog.to_regclass('pgmq.meta') is null
     or not exists (select from pg_catalog.pg_attribute a
                     where a.attrelid operator(pg_catalog.=) pg_catalog.to_regclass('pgmq.message_record')
                       and a.attname operator(pg_catalog.=) 'headers' and not a.attisdropped) then
    raise exception 'pgfence pgmq layer: needs pgmq 1.5 or later installed first'
      using errcode = '55000', hint = 'create extension pgmq (or run pgmq''s pgmq.sql), then this file';
  end if;
end
$$;

create schema pgfence_pgmq;
comment on schema pgfence_pgmq is 'pgfence''s pgmq layer: fenced reads and results over pgmq queues.';
revoke all on schema pgfence_pgmq from public;
grant usage on schema pgfence_pgmq to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

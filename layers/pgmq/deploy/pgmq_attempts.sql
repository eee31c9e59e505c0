-- Deploy pgfence_pgmq:pgmq_attempts
--
-- pgfence's optional pgmq layer: fenced reads and results over pgmq queues. It lives in schema
-- pgfence under names that start with pgmq_ (pgfence's own upgrades leave those alone) and is
-- installed after pgmq and pgfence, never needed by either.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  if pg_catalog.to_regprocedure('pgfence.mark_fenced(text, bytea)') is null then
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

-- One row per message read through pgmq_read: what its attempt id stands for. The message's
-- read count is the proof of I5: a result is accepted while the message's read_ct is still
-- the one this read gave it, and outcome keeps the accepted result so that a retry is told
-- duplicate. Rows are kept like pgfence's finished tasks, as the record of who read what.
create table pgfence.pgmq_attempts (
  attempt_id  uuid primary key,
  queue       text not null,
  msg_id      bigint not null,
  read_ct     int not null,
  lease_id    uuid not null,
  read_at     timestamptz not null default clock_timestamp(),
  outcome     text check (outcome in ('archive', 'delete')),
  finished_at timestamptz
);
comment on table pgfence.pgmq_attempts is
  'Reads of pgmq messages under a lease (pgmq_read), and the result each attempt had accepted. Not a public interface.';

-- The attempt id of a read: the message id and read count in the clear (12 and 3 hex digits,
-- as pgfence's task attempt ids), scheme digit a, and 60 random bits. It needs no signature:
-- pgfence.pgmq_attempts holds what each id stands for, so an id nobody minted names nothing,
-- and guessing one is a 1 in 2^60 chance. (An HMAC, as task attempt ids carry because no row
-- holds them, costs about 70 µs here: per message read, it was most of the read's time.)
create function pgfence.pgmq_attempt_uuid(msg_id bigint, read_ct int)
returns uuid
language sql
volatile
as $$
  select pg_catalog.format('%s8%sa%s',
           pg_catalog.lpad(pg_catalog.to_hex(pgmq_attempt_uuid.msg_id operator(pg_catalog.&) 281474976710655), 12, '0'),
           pg_catalog.lpad(pg_catalog.to_hex(pgmq_attempt_uuid.read_ct operator(pg_catalog.&) 4095), 3, '0'),
           pg_catalog.left(pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text), 15))::pg_catalog.uuid;
$$;

-- The table of a queue, by name: the name is checked against pgmq's own rules for what it
-- builds table names from, then must be a queue pgmq knows, so nothing else is ever named in
-- the dynamic SQL built from it.
create function pgfence.pgmq_queue_table(queue text)
returns text
language plpgsql
stable
as $$
begin
  if queue is null or queue operator(pg_catalog.!~) '^[A-Za-z0-9_]{1,47}$' then
    perform pgfence.invalid_argument('queue', 'must be 1 to 47 characters from A-Z a-z 0-9 _', queue);
  end if;
  if not exists (select from pgmq.meta m where m.queue_name operator(pg_catalog.=) queue) then
    perform pgfence.invalid_argument('queue', 'no such pgmq queue', queue);
  end if;
  return 'q_' operator(pg_catalog.||) pg_catalog.lower(queue);
end
$$;

revoke all on table pgfence.pgmq_attempts from public;
grant select on table pgfence.pgmq_attempts to pgfence_monitor, pgfence_operator;
revoke all on function pgfence.pgmq_attempt_uuid(bigint, int), pgfence.pgmq_queue_table(text)
  from public;

commit;

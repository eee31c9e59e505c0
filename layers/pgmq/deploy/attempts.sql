-- Deploy pgfence_pgmq:attempts
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One row per message read through read(): what its attempt id stands for. The message is
-- named exactly: msg_id, and enqueued_at, which a producer that inserts a message again under
-- an old msg_id does not give it back; its read count is the proof of I5: a result is accepted
-- while the message's read_ct is still the one this read gave it. outcome keeps the accepted
-- result, so that a retry is told duplicate. Rows are kept, as the record of who read what.
create table pgfence_pgmq.attempts (
  attempt_id  uuid primary key,
  queue       text not null,
  msg_id      bigint not null,
  read_ct     int not null,
  enqueued_at timestamptz not null,
  lease_id    uuid not null,
  read_at     timestamptz not null default clock_timestamp(),
  outcome     text check (outcome in ('archive', 'delete')),
  finished_at timestamptz
);
comment on table pgfence_pgmq.attempts is
  'Reads of pgmq messages under a lease (read), and the result each attempt had accepted. Not a public interface: '
  'monitors read pgfence_pgmq.reads.';
-- update_status counts the open attempts of a resource's leases.
create index attempts_open on pgfence_pgmq.attempts (lease_id) where outcome is null;

-- Results refused because their attempt no longer held its message (I5): kept for operators,
-- never applied, never silently dropped; each different report of an attempt (archive,
-- delete) kept once, numbered per attempt as pgfence.stale_results numbers them.
create table pgfence_pgmq.stale_results (
  attempt_id  uuid not null references pgfence_pgmq.attempts,
  report      int not null,
  kind        text not null check (kind in ('archive', 'delete')),
  queue       text not null,
  msg_id      bigint not null,
  read_ct     int not null,
  received_at timestamptz not null default clock_timestamp(),
  primary key (attempt_id, report),
  unique (attempt_id, kind)
);
comment on table pgfence_pgmq.stale_results is
  'Archives and deletes of pgmq messages refused as stale: the message had been read again since, or was gone.';

-- What monitors and operators see of the reads: no attempt id or lease id (the holder's
-- capabilities), a reference to each instead (pgfence.capability_ref), which still correlates
-- the reads of one lease.
create view pgfence_pgmq.reads as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.lease_id) as lease_ref,
       l.resource, a.queue, a.msg_id, a.read_ct, a.enqueued_at, a.read_at, a.outcome, a.finished_at
  from pgfence_pgmq.attempts a
  left join pgfence.leases l on l.lease_id = a.lease_id;
comment on view pgfence_pgmq.reads is
  'One row per message read through pgfence_pgmq.read: references to its attempt and lease, the resource, the '
  'message, and the result accepted, if any.';

-- The attempt id of a read: the message id and read count in the clear (12 and 3 hex digits,
-- as pgfence's task attempt ids), scheme digit a, and 60 random bits. It needs no signature:
-- pgfence_pgmq.attempts holds what each id stands for, so an id nobody minted names nothing,
-- and guessing one is a 1 in 2^60 chance. (An HMAC, as task attempt ids carry because no row
-- holds them, costs about 70 µs here: per message read, it was most of the read's time.)
create function pgfence_pgmq.attempt_uuid(msg_id bigint, read_ct int)
returns uuid
language sql
volatile
as $$
  select pg_catalog.format('%s8%sa%s',
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.msg_id operator(pg_catalog.&) 281474976710655), 12, '0'),
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.read_ct operator(pg_catalog.&) 4095), 3, '0'),
           pg_catalog.left(pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text), 15))::pg_catalog.uuid;
$$;

-- The table of a queue, by name. Every name pgmq accepts is accepted (pgmq 1.13: at most 47
-- characters, none of $ ; -- or a quote; hyphens and capitals are fine), and must be a queue
-- pgmq knows, so nothing else is ever named; the dynamic SQL built from it quotes it (%I).
create function pgfence_pgmq.queue_table(queue text)
returns text
language plpgsql
stable
as $$
begin
  if queue is null or pg_catalog.length(queue) operator(pg_catalog.<) 1
     or pg_catalog.length(queue) operator(pg_catalog.>) 47
     or queue operator(pg_catalog.~) '\$|;|--|''' then
    perform pgfence.invalid_argument('queue', 'must be a pgmq queue name: 1 to 47 characters, none of $ ; -- or ''', queue);
  end if;
  if not exists (select from pgmq.meta m where m.queue_name operator(pg_catalog.=) queue) then
    perform pgfence.invalid_argument('queue', 'no such pgmq queue', queue);
  end if;
  return pg_catalog.lower('q_' operator(pg_catalog.||) queue);
end
$$;

-- The layer never widens pgmq's own grants: it acts for its caller (pgfence.invoker(): the
-- role set, else the session's user) only where that role could do the same with pgmq itself:
-- USAGE on schema pgmq, SELECT and write (what pgmq's own function does: UPDATE for read and
-- set_vt, DELETE for delete and archive) on the queue's table, and for archive INSERT on the
-- archive table. Each privilege asked for alone (has_table_privilege of a list asks for any).
create function pgfence_pgmq.check_allowed(queue_table text, write text, archive boolean default false)
returns void
language plpgsql
stable
as $$
declare
  v_role name := pgfence.invoker();
  v_table regclass := pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', queue_table));
begin
  if not coalesce(pg_catalog.has_schema_privilege(v_role, 'pgmq', 'usage')
                  and pg_catalog.has_table_privilege(v_role, v_table, 'select')
                  and pg_catalog.has_table_privilege(v_role, v_table, write)
                  and (not archive
                       or pg_catalog.has_table_privilege(v_role, pg_catalog.to_regclass(pg_catalog.format(
                            'pgmq.%I', 'a' operator(pg_catalog.||) pg_catalog.substr(queue_table, 2))), 'insert')),
                  false) then
    raise exception 'pgfence pgmq layer: role % may not do this with pgmq queue table pgmq.%', v_role, queue_table
      using errcode = '42501',
            hint = 'grant the role what pgmq itself needs (docs/pgmq.md, "Grants"), or call as a role that has it';
  end if;
end
$$;

-- A result admitted by its attempt writes a queue table that may be protected: the guard is
-- shown the attempt's lease's resource (pgfence.mark_fenced) for that one write, and the
-- caller puts back what this returns (NULL: the table is not protected, nothing was marked;
-- the keyed hash is spent only where a guard will look for it).
create function pgfence_pgmq.mark(queue_table text, lease_id uuid)
returns text
language sql
as $$
  select pgfence.mark_fenced(l.resource, k.hmac_key)
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) mark.lease_id
     and exists (select from pgfence.protections p
                  where p.tbl operator(pg_catalog.=)
                        pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', mark.queue_table)));
$$;

revoke all on table pgfence_pgmq.attempts, pgfence_pgmq.stale_results, pgfence_pgmq.reads from public;
grant select on table pgfence_pgmq.reads to pgfence_monitor, pgfence_operator;
grant select (report, kind, queue, msg_id, read_ct, received_at) on table pgfence_pgmq.stale_results
   to pgfence_monitor, pgfence_operator;
revoke all on function pgfence_pgmq.attempt_uuid(bigint, int), pgfence_pgmq.queue_table(text),
                       pgfence_pgmq.check_allowed(text, text, boolean), pgfence_pgmq.mark(text, uuid)
  from public;

commit;

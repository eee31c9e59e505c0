-- Revert pgfence:attempt_id: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- No check of claimed tasks here: the reverts of extend, complete, claim and report, which run
-- before this one, refuse while a task claimed under 0.2.0 is claimed (tasks.attempt_leases,
-- which tells them apart, is gone by now). A claim made while the revert runs is not held off
-- between Sqitch's steps: pause the queues first (docs/upgrading.md, "Going back").

-- An attempt_id is a version-8 UUID (RFC 9562) that names its task and attempt and is signed
-- over them and the lease that claimed it:
--   task_id (48 bits) | version 8 | attempt (12 bits) | variant | signature (60 bits)
-- so a result finds its task by primary key, and the current attempt's id is checked exactly.
-- The lease is signed in because task ids and attempt numbers can be issued again after an
-- asynchronous failover lost a claim; lease ids never are (I3).
-- An expression its callers inline (see pgfence.sign, also for why every name in it is
-- qualified): claim signs every id it mints with one read of the key.
create or replace function pgfence.attempt_uuid(task_id bigint, attempt int, lease_id uuid, key bytea)
returns uuid
language sql
stable
as $$
  select pg_catalog.format('%s8%s8%s',
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.task_id), 12, '0'),
           pg_catalog.lpad(pg_catalog.to_hex(attempt_uuid.attempt), 3, '0'),
           pg_catalog.left(pgfence.sign(pg_catalog.format('attempt %s %s %s', attempt_uuid.task_id,
                                                          attempt_uuid.attempt, attempt_uuid.lease_id),
                                        attempt_uuid.key), 15))::pg_catalog.uuid;
$$;

-- The same, reading the key itself: for checking one id.
create or replace function pgfence.attempt_uuid(task_id bigint, attempt int, lease_id uuid)
returns uuid
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_attempt_id uuid;
begin
  select pgfence.attempt_uuid(attempt_uuid.task_id, attempt_uuid.attempt, attempt_uuid.lease_id, k.key)
    into v_attempt_id
    from pgfence.signing_key k;
  return v_attempt_id;
end
$$;

-- The task id an attempt_id names (NULL for NULL), unchecked: an expression its callers inline
-- (see pgfence.sign) to find the task by primary key before they check the whole id.
create or replace function pgfence.attempt_task(attempt_id uuid)
returns bigint
language sql
immutable
as $$
  select pg_catalog.textcat('x0000', pg_catalog.left(pg_catalog.replace(attempt_task.attempt_id::pg_catalog.text, '-', ''), 12))
           ::pg_catalog.bit(64)::pg_catalog.int8;
$$;

-- The task and attempt number an attempt_id names; 22023 for NULL or an id of another shape.
-- The signature is checked by the caller, against the lease that holds the task.
create or replace function pgfence.attempt_of(attempt_id uuid, out task_id bigint, out attempt int)
language plpgsql
immutable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_hex text := replace(attempt_of.attempt_id::text, '-', '');
begin
  if v_hex is not null and substr(v_hex, 13, 1) = '8' and substr(v_hex, 17, 1) = '8' then
    task_id := ('x' || lpad(substr(v_hex, 1, 12), 16, '0'))::bit(64)::bigint;
    attempt := ('x' || lpad(substr(v_hex, 14, 3), 8, '0'))::bit(32)::int;
    if attempt >= 1 then
      return;
    end if;
  end if;
  perform pgfence.invalid_argument('attempt_id', 'is not an attempt id minted by pgfence.claim',
                                   attempt_of.attempt_id::text);
end
$$;

revoke all on function pgfence.attempt_uuid(bigint, int, uuid, bytea), pgfence.attempt_uuid(bigint, int, uuid),
                       pgfence.attempt_task(uuid), pgfence.attempt_of(uuid)
  from public;

drop function if exists pgfence.attempt_signed(uuid, bigint, int, uuid);
drop function if exists pgfence.attempt_uuid_0_1(bigint, int, uuid, bytea);

commit;

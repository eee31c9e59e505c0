-- Deploy pgfence:leases
-- requires: resources
--
-- Lock discipline (one row per lease, I1/I2/I7):
--   fence        FOR KEY SHARE on the lease row      held to the end of the fenced transaction
--   renew        FOR NO KEY UPDATE (plain UPDATE)    does not wait for fenced transactions
--   takeover, drain, release, deprecate
--                FOR UPDATE on the lease row         waits for every open fenced transaction
-- FOR UPDATE is the only one of these that conflicts with FOR KEY SHARE, so a lease cannot
-- stop being current while a transaction that fenced it is open, yet its owner can keep
-- renewing during a long fenced transaction. Acquirers, request_start and update windows
-- serialize on the resource row (FOR NO KEY UPDATE), always taken before any lease row.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- One sequence for all resources: generations strictly increase per resource (takeovers of a
-- resource serialize on its row), and never repeat, even if a resource is dropped and
-- registered again.
create sequence pgfence.generation as bigint;

create type pgfence.lease as (
  lease_id   uuid,
  resource   text,
  generation bigint,
  expires_at timestamptz
);
comment on type pgfence.lease is 'A lease as acquire returns it: present lease_id, stamp generation, mind expires_at.';

create table pgfence.leases (
  lease_id      uuid primary key,
  resource      text not null references pgfence.resources,
  generation    bigint not null unique,
  owner         text not null,
  state         text not null check (state in ('active', 'draining', 'released', 'superseded')),
  acquired_at   timestamptz not null,
  renewed_at    timestamptz,
  expires_at    timestamptz not null,
  renewed_from  timestamptz,                   -- the expiry the latest renewal replaced (see renew)
  drained_at    timestamptz,                   -- when it stopped claiming (drain, deprecate, update window)
  ended_at      timestamptz,
  invocation_id uuid
) with (fillfactor = 70);  -- room on the page keeps renewals HOT
comment on table pgfence.leases is 'Every lease ever granted. Not a public interface: use the functions and lease_status.';
-- I1 as a constraint, behind the locking protocol: never two active leases for one resource.
create unique index leases_one_active on pgfence.leases (resource) where state = 'active';
create index leases_draining on pgfence.leases (resource) where state = 'draining';

revoke all on table pgfence.leases from public;
revoke all on sequence pgfence.generation from public;

commit;

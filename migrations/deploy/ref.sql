-- Deploy pgfence:ref
-- requires: capability_ref

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- How an error names a lease id, attempt id, invocation id, update token or request id: by a
-- reference, never the id itself. The ids are capabilities (whoever has a lease id may fence,
-- renew and release under it) and error messages land in server logs (on Supabase, readable
-- by every project member) and in the clients' logs. Until 0.3.0 the reference was the first
-- 12 hex digits of the id's unkeyed SHA-256: harmless for a lease id's 122 random bits, but a
-- pgmq attempt id has 60, and its message id and read count are in the clear, so its digest
-- could be searched. Keyed with the install's signing key, nobody without the key can test a
-- guess: the first 12 hex digits of capability_ref, the reference the monitoring views show,
-- so an error's reference also finds the row there (`lease_ref like 'abc…%'`). The holder of
-- an id asks the database for its reference (pgfence.ref, granted to the three roles).
create or replace function pgfence.ref(id uuid)
returns text
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select left(pgfence.capability_ref(ref.id), 12);
$$;
comment on function pgfence.ref(uuid) is
  'The reference by which errors name an id (a capability, never shown): the first 12 hex digits of its '
  'capability_ref, an HMAC under the install''s signing key.';

revoke all on function pgfence.ref(uuid) from public;
grant execute on function pgfence.ref(uuid) to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

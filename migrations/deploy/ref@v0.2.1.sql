-- Deploy pgfence:ref
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- How an error names a lease id, attempt id, invocation id, update token or request id: by a
-- digest of it, never the id itself. The ids are capabilities (whoever has a lease id may
-- fence, renew and release under it) and error messages land in server logs (on Supabase,
-- readable by every project member) and in the clients' logs. The first 12 hex digits of the
-- id's SHA-256: enough to tell ids apart in a log, and a uuid's 122 random bits cannot be
-- recovered from it. The owner of an id computes the same digest to find its own errors.
create function pgfence.ref(id uuid)
returns text
language sql
immutable
set search_path = pg_catalog, pg_temp
as $$
  select left(encode(sha256(convert_to(ref.id::text, 'UTF8')), 'hex'), 12);
$$;
comment on function pgfence.ref(uuid) is
  'The digest by which errors name an id (a capability, never shown): the first 12 hex digits of SHA-256 of its text.';

revoke all on function pgfence.ref(uuid) from public;
grant execute on function pgfence.ref(uuid) to pgfence_worker, pgfence_operator, pgfence_monitor;

commit;

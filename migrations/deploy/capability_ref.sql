-- Deploy pgfence:capability_ref
-- requires: capability_ref@v0.2.1
-- A whole definition (a fresh install runs only this one): capability_ref, now STRICT, and
-- invoker, unchanged.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- What monitors and operators see in place of a capability (a lease id, an attempt id): 16 hex
-- digits of an HMAC under the signing key. The same id always gives the same reference, so
-- rows still correlate; without the key nobody can turn a reference back into the id (an
-- unsigned hash of a pgmq attempt id, which has 60 random bits, could be searched).
create or replace function pgfence.capability_ref(id uuid)
returns text
language sql
stable
strict
security definer
set search_path = pg_catalog, pg_temp
as $$
  select pg_catalog.left(pgfence.hmac(pg_catalog.format('ref %s', capability_ref.id), k.hmac_key), 16)
    from pgfence.signing_key k;
$$;
comment on function pgfence.capability_ref(uuid) is
  'A non-reversible reference to a lease id or attempt id (16 hex digits of an HMAC under the signing key): '
  'what monitoring views show instead of the capability; NULL for NULL (STRICT: before 0.3.0 every NULL id '
  'got one shared, real-looking reference).';

-- The role a SECURITY DEFINER function acts for: the one its caller runs as (SET ROLE, as
-- PostgREST and Supabase do, else the session's user). A definer function's own current_user
-- is its owner; the role setting is not changed by it. Nobody can claim a role this way that
-- they could not SET ROLE to and use directly. The layers check the third party's privileges
-- of this role (pgmq's, pgflow's) before acting for it.
-- No SET and every name qualified, so that it is inlined into its callers' expressions.
create or replace function pgfence.invoker()
returns name
language sql
stable
as $$
  select case when pg_catalog.current_setting('role') operator(pg_catalog.=) 'none'
              then session_user
              else pg_catalog.current_setting('role')::pg_catalog.name end;
$$;
comment on function pgfence.invoker() is
  'The role the caller of a SECURITY DEFINER function acts as (SET ROLE, else session_user).';

revoke all on function pgfence.capability_ref(uuid), pgfence.invoker() from public;
grant execute on function pgfence.capability_ref(uuid) to pgfence_monitor, pgfence_operator;

commit;

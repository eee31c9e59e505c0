-- Deploy pgfence:capability_ref
-- requires: capability_ref@v0.2.1

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- STRICT: no id, no reference. Before 0.3.0 a NULL id got the HMAC of 'ref ', one reference
-- shared by every missing id (a view's NULL read id, deprecate's "no lease") that looked real.
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
  'what monitoring views show instead of the capability; NULL for NULL.';

commit;

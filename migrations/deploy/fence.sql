-- Deploy pgfence:fence
-- requires: hmac
-- requires: lease_judgement
-- requires: leases
-- requires: signing_key

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The proof that this transaction fenced resource: a keyed hash of the transaction id and the
-- resource name. It is worthless in any other transaction, and from a session-level SET.
-- Inlined like hmac: fence and the guard compute it on every fenced transaction and every
-- protected write.
create or replace function pgfence.fence_token(resource text, key bytea)
returns text
language sql
stable
as $$
  select pgfence.hmac(pg_catalog.format('fence %s %s', pg_catalog.pg_current_xact_id(), fence_token.resource),
                      fence_token.key);
$$;
revoke all on function pgfence.fence_token(text, bytea) from public;

-- Adds resource's marker to this transaction's fence markers (what the guard looks for), once,
-- and returns the markers as they were. The markers are transaction-local: they end at
-- commit, rollback or rollback to an earlier savepoint, exactly as the lease row lock that
-- fence holds. A caller that admits only one write of its own (the pgmq layer's late archive,
-- authorized by its attempt rather than a current lease) puts them back afterwards.
create or replace function pgfence.mark_fenced(resource text, key bytea)
returns text
language plpgsql
as $$
declare
  v_was text := coalesce(pg_catalog.current_setting('pgfence.fenced', true), '');
  v_token text := E'\n' operator(pg_catalog.||) pgfence.fence_token(mark_fenced.resource, mark_fenced.key)
                  operator(pg_catalog.||) E'\n';
begin
  -- The markers: each token between newlines ("\nT1\nT2\n"), so that strpos finds whole ones.
  if pg_catalog.strpos(v_was, v_token) operator(pg_catalog.=) 0 then
    perform pg_catalog.set_config('pgfence.fenced', pg_catalog.rtrim(v_was, E'\n') operator(pg_catalog.||) v_token, true);
  end if;
  return v_was;
end
$$;
revoke all on function pgfence.mark_fenced(text, bytea) from public;

create or replace function pgfence.fence(lease_id uuid)
returns bigint
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  -- The lease row stays locked until the caller's transaction ends (I2). (hold_current checks
  -- for a NULL lease_id when it finds no lease.)
  v_lease pgfence.leases := pgfence.hold_current(fence.lease_id);
begin
  perform pgfence.mark_fenced(v_lease.resource, k.hmac_key) from pgfence.signing_key k;
  return v_lease.generation;
end
$$;
comment on function pgfence.fence(uuid) is
  'Call inside the transaction it protects: returns the generation if the lease is the resource''s active, '
  'unexpired lease, and keeps it so until the transaction ends. Raises PF001 otherwise.';

revoke all on function pgfence.fence(uuid) from public;
grant execute on function pgfence.fence(uuid) to pgfence_worker;

commit;

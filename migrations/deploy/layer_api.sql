-- Deploy pgfence:layer_api
-- requires: lease_judgement
-- requires: fence
-- requires: protections
-- requires: limit_idle
--
-- What a layer (layers/*) calls instead of reading the core's tables: no layer reads
-- pgfence.leases or pgfence.signing_key itself, so a column added to a lease, or a new key,
-- changes none of them. None is granted to a worker: a layer's SECURITY DEFINER functions run
-- as the installer, who owns these; lease_facts alone is the monitors' too (the layers' views
-- call it as their reader).
--
-- Reworked in 0.3.1: mark_lease is PL/pgSQL, so its statements are planned once per session
-- (as a LANGUAGE sql function that is not inlined, it was planned again on every call: 50 µs of
-- every pgmq archive). A whole definition (a fresh install runs only this one).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.expect_release('pgfence', '0.3.0'); end $$;

-- What fence does, for a layer's read under a lease (pgfence_pgmq.read, and so pgflow's
-- start): the lease held current to the end of the transaction (hold_current: FOR KEY SHARE,
-- its idle time bounded by what the lease has left) and the transaction marked fenced for its
-- resource, so the read's own writes pass the guards of a protected queue. On the read's hot
-- path: no SET, every name qualified.
create or replace function pgfence.hold_fenced(lease_id uuid)
returns pgfence.lease
language plpgsql
as $$
declare
  v_lease pgfence.leases := pgfence.hold_current(hold_fenced.lease_id);
begin
  perform pgfence.mark_fenced(v_lease.resource, k.hmac_key) from pgfence.signing_key k;
  return row(v_lease.lease_id, v_lease.resource, v_lease.generation, v_lease.expires_at)::pgfence.lease;
end
$$;
comment on function pgfence.hold_fenced(uuid) is
  'For a layer''s read under a lease: holds it current to the end of the transaction (PF001 otherwise) and '
  'marks the transaction fenced for its resource, as fence does; returns it.';

-- A write that an attempt authorizes rather than a current lease (a late result, accepted
-- after its lease expired or drained): the guard of tbl (of any protected table when tbl is
-- NULL) is shown the attempt's lease's resource. Returns the markers as they were, for the
-- caller to put back after that one write (set_config('pgfence.fenced', ..., true)); NULL when
-- nothing was marked (tbl is not protected, or the lease is gone), and the keyed hash is then
-- not spent. On the results' hot path: no SET, every name qualified, and PL/pgSQL, whose
-- statements keep their plans (a LANGUAGE sql function with a FROM is planned on every call).
create or replace function pgfence.mark_lease(lease_id uuid, tbl regclass default null)
returns text
language plpgsql
as $$
declare
  v_was text;
begin
  if mark_lease.tbl is not null
     and not exists (select from pgfence.protections p where p.tbl operator(pg_catalog.=) mark_lease.tbl) then
    return null;
  end if;
  select pgfence.mark_fenced(l.resource, k.hmac_key) into v_was
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) mark_lease.lease_id;
  return v_was;
end
$$;
comment on function pgfence.mark_lease(uuid, regclass) is
  'For a write an attempt authorizes: marks the transaction fenced for its lease''s resource where tbl is protected '
  '(any table when NULL); returns the markers to put back, NULL when nothing was marked.';

-- A third party's maintenance that writes protected tables for every resource at once (pgflow's
-- stalled-task recovery, its worker pruning): the transaction is marked fenced for every
-- resource whose protection covers one of tables. Returns the markers to put back.
create or replace function pgfence.mark_guards(tables regclass[])
returns text
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_was text := coalesce(current_setting('pgfence.fenced', true), '');
begin
  perform pgfence.mark_fenced(r.resource, k.hmac_key)
     from (select distinct unnest(p.resources) as resource from pgfence.protections p
            where p.tbl = any (mark_guards.tables)) r,
          pgfence.signing_key k;
  return v_was;
end
$$;
comment on function pgfence.mark_guards(regclass[]) is
  'For a third party''s maintenance: marks the transaction fenced for every resource protecting one of tables; '
  'returns the markers to put back.';

-- What a layer and its monitors may know of the leases its attempts name: no capability but
-- the ids it was given. status as pgfence.lease_status names it; live: active or draining and
-- not expired (pgfence.is_live), the lease may still renew and finish what it holds.
create or replace function pgfence.lease_facts(lease_ids uuid[])
returns table (lease_id uuid, resource text, owner text, generation bigint, status text, live boolean)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select l.lease_id, l.resource, l.owner, l.generation,
         case when pgfence.is_current(l.state, l.expires_at) then 'current'
              when l.state = 'active' then 'stale'
              else l.state end,
         pgfence.is_live(l.state, l.expires_at)
    from pgfence.leases l
   where l.lease_id = any (lease_facts.lease_ids);
$$;
comment on function pgfence.lease_facts(uuid[]) is
  'The resource, owner, generation and status (as lease_status) of each lease given, and whether it is live.';

-- A reference to the owner of a lease, the same for every lease that owner name holds on the
-- resource and never the lease id (which is the owner's capability): a keyed hash of purpose,
-- resource and owner, encoded so that no two pairs meet (resource 'a/b' with owner 'c' and
-- resource 'a' with owner 'b/c' are two owners). A third party's worker row is keyed by it
-- (pgflow.workers: a worker that acquires again keeps its row). On the start's hot path.
create or replace function pgfence.owner_ref(lease_id uuid, purpose text, out resource text, out ref uuid)
language plpgsql
stable
as $$
begin
  select l.resource,
         pg_catalog.left(pgfence.hmac(pg_catalog.jsonb_build_array(owner_ref.purpose, l.resource, l.owner)::pg_catalog.text,
                                      k.hmac_key), 32)::pg_catalog.uuid
    into resource, ref
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) owner_ref.lease_id;
end
$$;
comment on function pgfence.owner_ref(uuid, text) is
  'The lease''s resource, and a keyed reference to its owner for purpose, the same across the owner''s leases: '
  'never the lease id.';

-- The bounded lock wait of a layer's result (a worker's, on a hot path): locks that another
-- session holds are waited for at most 5 s (a caller's shorter lock_timeout is kept), then
-- 55P03, which the clients retry. Every function that locks rows others need bounds its idle
-- time (limit_idle), so a holder lets go within that bound and a retry gets through. Returns
-- the setting to put back once the locks are taken.
create or replace function pgfence.limit_lock_wait()
returns text
language plpgsql
as $$
declare
  v_set text := pg_catalog.current_setting('lock_timeout');
begin
  if v_set operator(pg_catalog.=) '0'
     or v_set::pg_catalog.interval operator(pg_catalog.>) '5 s'::pg_catalog.interval then
    perform pg_catalog.set_config('lock_timeout', '5s', true);
  end if;
  return v_set;
end
$$;
comment on function pgfence.limit_lock_wait() is
  'Limits how long the calling transaction waits for a lock to 5 s (a shorter limit is kept): 55P03 then. Returns '
  'the setting to put back.';

-- A layer's retention, written once (pgfence.prune's shape; each layer's prune calls it): its
-- stale results received before the bound, then its attempts that ended before it, each in
-- batches of 5000 chosen FOR UPDATE SKIP LOCKED (never waiting for a worker), at most 100
-- batches a table per call. An attempt has ended when its result was accepted (outcome) before
-- the bound, or when it has none and can no longer be accepted (not in live: the layer's
-- judgement) and was started (the column named started) before the bound: an abandoned one
-- (its worker died, or was taken over) goes too, so its lease is no longer kept either. An
-- attempt with stale results left is kept until they go.
create or replace function pgfence.prune_attempts(attempts regclass, stale_results regclass, started name,
                                       older_than interval, live uuid[])
returns table (what text, rows bigint)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  c_batch constant int := 5000;
  c_batches constant int := 100;
  v_before timestamptz;
  v_n bigint;
begin
  if prune_attempts.older_than is null or prune_attempts.older_than <= interval '0' then
    perform pgfence.invalid_argument('older_than', 'must be a positive interval', prune_attempts.older_than::text);
  end if;
  v_before := clock_timestamp() - prune_attempts.older_than;
  what := prune_attempts.stale_results::text; rows := 0;
  for i in 1 .. c_batches loop
    execute format('delete from %1$s s where s.ctid = any (array(select x.ctid from %1$s x where x.received_at < $1 '
                   'limit $2 for update skip locked))', prune_attempts.stale_results)
      using v_before, c_batch;
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;
  what := prune_attempts.attempts::text; rows := 0;
  for i in 1 .. c_batches loop
    execute format('delete from %1$s a where a.attempt_id = any (array('
                   '  select x.attempt_id from %1$s x'
                   '   where (x.finished_at < $1'
                   '          or (x.outcome is null and x.%3$I < $1 and x.attempt_id <> all ($3)))'
                   '     and not exists (select from %2$s s where s.attempt_id = x.attempt_id)'
                   '   limit $2 for update skip locked))',
                   prune_attempts.attempts, prune_attempts.stale_results, prune_attempts.started)
      using v_before, c_batch, coalesce(prune_attempts.live, '{}');
    get diagnostics v_n = row_count;
    rows := rows + v_n;
    exit when v_n < c_batch;
  end loop;
  return next;
end
$$;
comment on function pgfence.prune_attempts(regclass, regclass, name, interval, uuid[]) is
  'A layer''s retention: its stale results and its ended attempts (accepted, or abandoned: not live) older than '
  'older_than, in batches. Rows removed per table. Raises 22023.';

revoke all on function pgfence.hold_fenced(uuid), pgfence.mark_lease(uuid, regclass),
                       pgfence.mark_guards(regclass[]), pgfence.lease_facts(uuid[]),
                       pgfence.owner_ref(uuid, text), pgfence.limit_lock_wait(),
                       pgfence.prune_attempts(regclass, regclass, name, interval, uuid[])
  from public;
-- The layers' monitoring views call it as their reader. It tells nothing of a lease to whoever
-- does not already hold its id.
grant execute on function pgfence.lease_facts(uuid[]) to pgfence_monitor, pgfence_operator;

commit;

-- Deploy pgfence_pgmq:prune_health
-- requires: in_flight

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Retention (pgfence.prune's shape, registered in pgfence.layers): the record of reads whose
-- result was accepted, and the stale results, older than older_than. Never a read still
-- open: its message may still be archived or deleted through it. In batches of 10,000 rows,
-- so that a large backlog never holds one long transaction's locks.
create function pgfence_pgmq.prune(older_than interval)
returns table (what text, "rows" bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_cutoff timestamptz;
  v_n bigint;
  v_stale bigint := 0;
  v_reads bigint := 0;
begin
  if prune.older_than is null or prune.older_than <= interval '0' then
    perform pgfence.invalid_argument('older_than', 'must be a positive interval', prune.older_than::text);
  end if;
  v_cutoff := clock_timestamp() - prune.older_than;
  loop
    delete from pgfence_pgmq.stale_results s
     where s.ctid = any (array(select x.ctid from pgfence_pgmq.stale_results x
                                where x.received_at < v_cutoff limit 10000));
    get diagnostics v_n = row_count;
    v_stale := v_stale + v_n;
    exit when v_n < 10000;
  end loop;
  loop
    delete from pgfence_pgmq.attempts a
     where a.attempt_id = any (array(
             select x.attempt_id from pgfence_pgmq.attempts x
              where x.outcome is not null and x.finished_at < v_cutoff
                and not exists (select from pgfence_pgmq.stale_results s where s.attempt_id = x.attempt_id)
              limit 10000));
    get diagnostics v_n = row_count;
    v_reads := v_reads + v_n;
    exit when v_n < 10000;
  end loop;
  return query values ('pgfence_pgmq.stale_results'::text, v_stale), ('pgfence_pgmq.attempts', v_reads);
end
$$;
comment on function pgfence_pgmq.prune(interval) is
  'pgfence.layers: deletes finished reads and stale results older than older_than, in batches; never an open read. '
  'Raises 22023.';

-- Health (pgfence.health's shape, registered in pgfence.layers).
create function pgfence_pgmq.health()
returns table ("check" text, ok boolean, detail text)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select 'pgmq layer: pgmq installed', pg_catalog.to_regclass('pgmq.meta') is not null,
         'the layer reads pgmq''s queues (pgmq 1.5 or later)'
  union all
  select 'pgmq layer: locked down', count(*) = 0,
         coalesce('privileges held by ' || string_agg(distinct case g.grantee when 0 then 'public'
                                                            else g.grantee::regrole::text end, ', '),
                  'nobody but the owner and the pgfence roles holds a privilege in schema pgfence_pgmq')
    from (select a.grantee, p.proowner as owner from pg_proc p, aclexplode(p.proacl) a
           where p.pronamespace = 'pgfence_pgmq'::regnamespace
          union all
          select a.grantee, c.relowner from pg_class c, aclexplode(c.relacl) a
           where c.relnamespace = 'pgfence_pgmq'::regnamespace) g
   where g.grantee <> g.owner
     and g.grantee not in (select oid from pg_roles
                            where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'));
$$;
comment on function pgfence_pgmq.health() is 'pgfence.layers: the pgmq layer''s own checks.';

revoke all on function pgfence_pgmq.prune(interval), pgfence_pgmq.health() from public;
update pgfence.layers
   set prune = 'pgfence_pgmq.prune(interval)', health = 'pgfence_pgmq.health()'
 where schema_name = 'pgfence_pgmq';

commit;

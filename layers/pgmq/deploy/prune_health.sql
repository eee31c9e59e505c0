-- Deploy pgfence_pgmq:prune_health
-- requires: in_flight
--
-- Reworked in 0.3.0: pruning written once in the core (pgfence.prune_attempts); a read without
-- a result that can no longer be accepted (its worker died, or it was taken over) is pruned
-- too, once older than the bound. The check "locked down" is the core's now ("roles and
-- grants" covers every layer's schema).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Retention (pgfence.prune's shape, registered in pgfence.layers): the record of reads that
-- ended before older_than (accepted, or abandoned: no longer acceptable, open_reads) and the
-- stale results, by the core's batched pruning. Never a read that can still be accepted.
create or replace function pgfence_pgmq.prune(older_than interval)
returns table (what text, "rows" bigint)
language sql
security definer
set search_path = pg_catalog, pg_temp
as $$
  select p.what, p.rows
    from pgfence.prune_attempts('pgfence_pgmq.attempts', 'pgfence_pgmq.stale_results', 'read_at', prune.older_than,
                                array(select o.attempt_id from pgfence_pgmq.open_reads() o)) p;
$$;
comment on function pgfence_pgmq.prune(interval) is
  'pgfence.layers: deletes the reads that ended (accepted, or abandoned) and the stale results older than '
  'older_than, in batches; never a read that can still be accepted. Raises 22023.';

-- Health (pgfence.health's shape, registered in pgfence.layers).
create or replace function pgfence_pgmq.health()
returns table ("check" text, ok boolean, detail text)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select 'pgmq layer: pgmq installed', pg_catalog.to_regclass('pgmq.meta') is not null,
         'the layer reads pgmq''s queues (pgmq 1.5 or later)';
$$;
comment on function pgfence_pgmq.health() is 'pgfence.layers: the pgmq layer''s own checks.';

revoke all on function pgfence_pgmq.prune(interval), pgfence_pgmq.health() from public;
update pgfence.layers
   set prune = 'pgfence_pgmq.prune(interval)', health = 'pgfence_pgmq.health()'
 where schema_name = 'pgfence_pgmq';

commit;

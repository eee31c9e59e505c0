-- Deploy pgfence_pgflow:pgflow_mark_stopped
-- requires: pgflow_start_tasks

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- pgflow 0.14's worker marks its pgflow.workers row stopped when it ends
-- (pgflow.mark_worker_stopped(worker_id), its id being the Edge Runtime's execution id). The
-- layer's row has a keyed id nobody but the layer can compute, so a fenced worker names its
-- row by the lease it last started under: its capability, which only it holds. Only a lease
-- that is no longer live (released, superseded, expired): a worker that still holds its lease
-- has not stopped. pgflow before 0.9 has no stopped_at: there the row is deprecated.
create function pgfence_pgflow.mark_worker_stopped(lease_id uuid)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_worker uuid;
  v_rows bigint;
begin
  perform pgfence.check_not_null('lease_id', mark_worker_stopped.lease_id);
  select wl.worker_id into v_worker
    from pgfence_pgflow.worker_leases wl
    join pgfence.lease_facts(array[mark_worker_stopped.lease_id]) f on f.lease_id = wl.lease_id
   where wl.lease_id = mark_worker_stopped.lease_id and not f.live;
  if v_worker is null then
    return false;
  end if;
  if exists (select from pg_catalog.pg_attribute a
              where a.attrelid = 'pgflow.workers'::regclass and a.attname = 'stopped_at' and not a.attisdropped) then
    execute 'update pgflow.workers w set stopped_at = clock_timestamp()
               where w.worker_id = $1 and w.stopped_at is null' using v_worker;
  else
    update pgflow.workers w set deprecated_at = clock_timestamp()
     where w.worker_id = v_worker and w.deprecated_at is null;
  end if;
  get diagnostics v_rows = row_count; -- EXECUTE leaves FOUND alone
  -- The worker's row stays locked to the end of the transaction: pgflow's own heartbeats and
  -- ensure_workers need it, so the transaction may idle only as long as the core's may.
  perform pgfence.limit_idle();
  return v_rows > 0;
end
$$;
comment on function pgfence_pgflow.mark_worker_stopped(uuid) is
  'pgflow''s mark_worker_stopped for a fenced worker: its pgflow.workers row, named by the lease it last started under, '
  'is marked stopped_at (deprecated_at before pgflow 0.9) once that lease is no longer live. False when there is no such '
  'row, the lease is still live, or a newer lease of the worker started since.';

revoke all on function pgfence_pgflow.mark_worker_stopped(uuid) from public;
grant execute on function pgfence_pgflow.mark_worker_stopped(uuid) to pgfence_worker;

commit;

-- Deploy pgfence_pgflow:pgflow_prune_health
-- requires: pgflow_in_flight
--
-- Reworked in 0.3.0: written once in the core (pgfence.prune_attempts, cron_job_problem); a
-- start without a result that can no longer be accepted (its worker died, and the task was
-- taken over) is pruned too, once older than the bound; health checks the layer's pg_cron jobs
-- for real. The check "locked down" is the core's now ("roles and grants" covers every
-- layer's schema).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Retention (pgfence.prune's shape, registered in pgfence.layers): the record of starts that
-- ended before older_than (accepted, or abandoned: no longer acceptable, open_starts) and the
-- stale results, by the core's batched pruning; never a start that can still be accepted.
create or replace function pgfence_pgflow.prune(older_than interval)
returns table (what text, "rows" bigint)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  return query
  select p.what, p.rows
    from pgfence.prune_attempts('pgfence_pgflow.attempts', 'pgfence_pgflow.stale_results', 'started_at',
                                prune.older_than, array(select o.attempt_id from pgfence_pgflow.open_starts() o)) p;
  -- The ended worker rows (pgflow.workers), also under enforce: pgfence_pgflow.prune_workers,
  -- of the later change pgflow_workers (called by name, so that reverting that change leaves
  -- this prune working).
  if pg_catalog.to_regprocedure('pgfence_pgflow.prune_workers(interval)') is not null then
    return query execute 'select * from pgfence_pgflow.prune_workers($1)' using prune.older_than;
  end if;
end
$$;
comment on function pgfence_pgflow.prune(interval) is
  'pgfence.layers: deletes the starts that ended (accepted, or abandoned) and the stale results older than older_than, '
  'in batches; never a start that can still be accepted; and the ended worker rows (pgfence_pgflow.prune_workers). '
  'Raises 22023.';

-- A job of the layer, for real (pgfence.cron_job_problem), and none of pgflow's own still
-- calling what it replaces: pgflow's ensure_workers pings the resources' functions without the
-- startup handshake, and its requeue_stalled_tasks takes over live tasks by the flow's timeout.
-- NULL when the layer's job is as it should be and pgflow's own is not active here.
create or replace function pgfence_pgflow.job_problem(layer_fn regprocedure, own_fn text)
returns text
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_jobs regclass := pg_catalog.to_regclass('cron.job');
  v_own text;
begin
  if v_jobs is not null then
    execute format($q$select string_agg(format('job %%s (%%s) still calls %%s', j.jobid,
                                               coalesce(to_jsonb(j)->>'jobname', 'no name'), $1), '; ' order by j.jobid)
                        from %s j
                       where j.active and j.database = current_database()
                         and j.command ~* ('^\s*select\s+' || replace($1, '.', '\.') || '\s*\(\s*\)\s*;?\s*$')$q$, v_jobs)
      into v_own using own_fn;
  end if;
  return nullif(concat_ws('; ', pgfence.cron_job_problem(layer_fn),
                          v_own || ': run pgfence_pgflow.setup_cron() (docs/pgflow.md)'), '');
end
$$;
revoke all on function pgfence_pgflow.job_problem(regprocedure, text) from public;

-- Health (pgfence.health's shape, registered in pgfence.layers): pgflow installed, and where
-- pgflow schedules jobs (0.9 and later: ensure_workers; 0.13 and later: requeue_stalled_tasks)
-- the layer's two jobs for real.
create or replace function pgfence_pgflow.health()
returns table ("check" text, ok boolean, detail text)
language sql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
  select 'pgflow layer: pgflow installed', pg_catalog.to_regclass('pgflow.step_tasks') is not null,
         'the layer starts pgflow''s tasks (pgflow 0.8 or later)'
  union all
  select 'pgflow layer: ensure_workers job', p is null,
         coalesce(p, case when pg_catalog.to_regprocedure('pgflow.ensure_workers()') is null
                          then 'pgflow before 0.9 starts no workers: no job needed'
                          else 'a pg_cron job runs pgfence_pgflow.ensure_workers(); none runs pgflow''s own' end)
    from (select case when pg_catalog.to_regprocedure('pgflow.ensure_workers()') is not null
                      then pgfence_pgflow.job_problem('pgfence_pgflow.ensure_workers()', 'pgflow.ensure_workers') end) x(p)
  union all
  select 'pgflow layer: requeue job', p is null,
         coalesce(p, case when pg_catalog.to_regprocedure('pgflow.requeue_stalled_tasks()') is null
                          then 'pgflow before 0.13 schedules no recovery: the layer''s takeover recovers its tasks'
                          else 'a pg_cron job runs pgfence_pgflow.requeue_stalled_tasks(); none runs pgflow''s own' end)
    from (select case when pg_catalog.to_regprocedure('pgflow.requeue_stalled_tasks()') is not null
                      then pgfence_pgflow.job_problem('pgfence_pgflow.requeue_stalled_tasks()',
                                                      'pgflow.requeue_stalled_tasks') end) x(p);
$$;
comment on function pgfence_pgflow.health() is 'pgfence.layers: the pgflow layer''s own checks.';

revoke all on function pgfence_pgflow.prune(interval), pgfence_pgflow.health() from public;
update pgfence.layers
   set prune = 'pgfence_pgflow.prune(interval)', health = 'pgfence_pgflow.health()'
 where schema_name = 'pgfence_pgflow';

commit;

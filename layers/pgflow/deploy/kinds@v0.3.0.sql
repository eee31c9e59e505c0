-- Deploy pgfence_pgflow:kinds
--
-- The kind of every function of the layer that is not its API (what pgfence_worker or
-- pgfence_operator may execute), as the first word of its comment (pgfence.set_kind, the
-- core's kinds change): Hook (the core calls it through the layer's row of pgfence.layers),
-- Private (a helper of this schema). A new one is added to its kind's list here.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- setup_cron and undo_cron are run by the role that owns pgflow's cron jobs (pg_cron lets only
-- a job's owner alter it; docs/pgflow.md), granted to no pgfence role: Private by the kinds'
-- rule, though that owner calls them.
do $$
begin
  perform pgfence.set_kind('Hook', 'pgfence_pgflow.enabled_changed(text[])',
                           'pgfence_pgflow.health()', 'pgfence_pgflow.in_flight()',
                           'pgfence_pgflow.leases()', 'pgfence_pgflow.prune(interval)',
                           'pgfence_pgflow.window_finish(uuid)',
                           'pgfence_pgflow.window_prepare(uuid, text[])',
                           'pgfence_pgflow.window_status(uuid, text[])');
  perform pgfence.set_kind('Private',
                           'pgfence_pgflow.as_maintenance(text, interval)',
                           'pgfence_pgflow.check_allowed(regprocedure)',
                           'pgfence_pgflow.cron_commands()',
                           'pgfence_pgflow.follow_resource()',
                           'pgfence_pgflow.job_problem(regprocedure, text)',
                           'pgfence_pgflow.open_starts()',
                           'pgfence_pgflow.setup_cron()',
                           'pgfence_pgflow.stalled(timestamp with time zone, integer, boolean, boolean)',
                           'pgfence_pgflow.start_lease_live(uuid, text, integer, integer)',
                           'pgfence_pgflow.undo_cron()');
end
$$;

commit;

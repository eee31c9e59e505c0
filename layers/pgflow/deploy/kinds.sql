-- Deploy pgfence_pgflow:kinds
--
-- The kind of every function of the layer that is not its API (what pgfence_worker or
-- pgfence_operator may execute), as the first word of its comment (pgfence.set_kind, the
-- core's kinds change): Hook (the core calls it through the layer's row of pgfence.layers),
-- Private (a helper of this schema). A new one is added to its kind's list here.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  perform pgfence.set_kind('Hook', 'pgfence_pgflow.health()', 'pgfence_pgflow.in_flight(text[])',
                           'pgfence_pgflow.leases()', 'pgfence_pgflow.prune(interval)');
  perform pgfence.set_kind('Private',
                           'pgfence_pgflow.as_maintenance(text, interval)',
                           'pgfence_pgflow.check_allowed(regprocedure)',
                           'pgfence_pgflow.follow_resource()',
                           'pgfence_pgflow.worker_id(uuid, bytea)');
end
$$;

commit;

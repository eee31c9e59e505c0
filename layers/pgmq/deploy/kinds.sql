-- Deploy pgfence_pgmq:kinds
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
  perform pgfence.set_kind('Hook', 'pgfence_pgmq.health()', 'pgfence_pgmq.in_flight()',
                           'pgfence_pgmq.leases()', 'pgfence_pgmq.prune(interval)');
  perform pgfence.set_kind('Private',
                           'pgfence_pgmq.attempt_uuid(bigint, integer)',
                           'pgfence_pgmq.check_allowed(text, text, boolean)',
                           'pgfence_pgmq.open_reads()',
                           'pgfence_pgmq.queue_table(text)');
end
$$;

commit;

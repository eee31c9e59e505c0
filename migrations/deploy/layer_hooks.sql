-- Deploy pgfence:layer_hooks
-- requires: layers

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The hooks through which the core calls a layer where the core itself acts, naming none
-- (each may be NULL: a layer that needs none leaves it so):
--   enabled_changed (resources text[]) returns void: after the core changed the enabled of
--     these resources (register of a new one, set_enabled, prepare_update, finish_update),
--     in the same transaction: a layer whose third party keeps its own switch follows it
--     there (pgflow's worker_functions.enabled);
--   window_prepare (token uuid, names text[]) returns setof text: prepare_update offers a
--     layer the names of its set that are not pgfence resources; the layer takes those it
--     manages (an unconverted pgflow worker function), saves their exact state, pauses them,
--     and returns them; a name nobody takes is unknown (PF002);
--   window_status (token uuid, names text[]) returns table(resource text, saved_enabled
--     boolean, enabled boolean, verdict text, heartbeat timestamptz, in_flight jsonb,
--     pending bigint, workers jsonb): update_status's rows for the names the layer took; and
--     for other names of the window (names: all of them) what the layer sees of their workers
--     (verdict NULL: the core's row gets its workers);
--   window_finish (token uuid) returns table(resource text, enabled boolean, outcome text):
--     finish_update's, restoring them exactly (idempotent).
-- And from this release the in_flight hook takes no argument: in_flight () returns
-- table(lease_id uuid, kind text, in_flight bigint): the layer's work still in flight, per
-- lease it was started under; the core judges the leases (pgfence.layer_work). A layer of 0.2
-- still answers per resource (in_flight (resources text[])) until it is upgraded.
-- Every function is named as text (a regprocedure's text, schema-qualified), the table's older
-- columns too, which were regprocedure up to 0.2.1: pg_upgrade refuses a database with a reg*
-- column whose OIDs it does not keep ("reg* data types in user tables"), and a name survives
-- it where an OID would not. Readers resolve the name (::regprocedure) when they call it.
-- (Each a rewrite under ACCESS EXCLUSIVE: of a table of one row per layer, which only the
-- core's functions and the layers' installs read.)
-- squawk-ignore changing-column-type
alter table pgfence.layers alter column in_flight type text using in_flight::text;
-- squawk-ignore changing-column-type
alter table pgfence.layers alter column leases type text using leases::text;
-- squawk-ignore changing-column-type
alter table pgfence.layers alter column prune type text using prune::text;
-- squawk-ignore changing-column-type
alter table pgfence.layers alter column health type text using health::text;
alter table pgfence.layers
  add column enabled_changed text,
  add column window_prepare text,
  add column window_status text,
  add column window_finish text;
comment on table pgfence.layers is
  'The optional layers installed, each with its in_flight, leases, prune and health functions and its hooks for '
  'enabled changes and update windows, named as text (schema-qualified signatures). Written by layer installs.';

-- Each layer's enabled_changed hook, in the layers' order: what register, set_enabled,
-- prepare_update and finish_update call after changing enabled, in their transaction (the
-- resource rows still locked), so a layer's own switch never disagrees with the resource's.
create function pgfence.enabled_changed(resources text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_hook regproc;
begin
  for v_hook in select l.enabled_changed::regprocedure::oid::regproc from pgfence.layers l
                 where l.enabled_changed is not null order by l.schema_name loop
    execute format('select %s($1)', v_hook) using enabled_changed.resources;
  end loop;
end
$$;
comment on function pgfence.enabled_changed(text[]) is
  'Calls each layer''s enabled_changed hook (pgfence.layers) with resources whose enabled just changed.';
revoke all on function pgfence.enabled_changed(text[]) from public;

-- Every layer's work in flight, per lease (each layer's in_flight hook, without arguments from
-- this release on), by the lease's generation: update_status and lease_status add it to the
-- tasks a lease holds, and judge the lease themselves (a silent holder). A generation, not a
-- lease id: lease_status's readers call it.
create function pgfence.layer_work()
returns table (generation bigint, kind text, in_flight bigint)
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_hook regproc;
begin
  for v_hook in select l.in_flight::regprocedure::oid::regproc from pgfence.layers l
                 where (select p.pronargs from pg_proc p where p.oid = l.in_flight::regprocedure) = 0
                 order by l.schema_name loop
    for generation, kind, in_flight in
      execute format('select l.generation, f.kind, f.in_flight from %s() f '
                     'join pgfence.leases l on l.lease_id = f.lease_id where f.in_flight > 0', v_hook)
    loop
      return next;
    end loop;
  end loop;
end
$$;
comment on function pgfence.layer_work() is
  'Each layer''s work in flight (pgfence.layers.in_flight), per lease generation and kind.';
revoke all on function pgfence.layer_work() from public;
grant execute on function pgfence.layer_work() to pgfence_monitor, pgfence_operator;

-- Each layer's rows of an update window (window_status): for the names it took, and the workers
-- it sees of the others (verdict NULL).
create function pgfence.layer_window(token uuid, names text[])
returns table (resource text, saved_enabled boolean, enabled boolean, verdict text, heartbeat timestamptz,
               in_flight jsonb, pending bigint, workers jsonb)
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_hook regproc;
begin
  for v_hook in select l.window_status::regprocedure::oid::regproc from pgfence.layers l
                 where l.window_status is not null order by l.schema_name loop
    for resource, saved_enabled, enabled, verdict, heartbeat, in_flight, pending, workers in
      execute format('select s.resource, s.saved_enabled, s.enabled, s.verdict, s.heartbeat, '
                     's.in_flight, s.pending, s.workers from %s($1, $2) s', v_hook)
        using layer_window.token, layer_window.names
    loop
      return next;
    end loop;
  end loop;
end
$$;
comment on function pgfence.layer_window(uuid, text[]) is
  'Each layer''s update_status rows of window token over names (pgfence.layers.window_status).';
revoke all on function pgfence.layer_window(uuid, text[]) from public;

commit;

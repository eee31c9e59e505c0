-- Deploy pgfence:finish_update
-- requires: lock_resources
-- requires: updates
-- requires: checks
-- requires: errors
-- requires: layer_hooks
--
-- Reworked in 0.3.0: the layers are told of the resources it enabled (enabled_changed),
-- and restore the names they took into the window (window_finish).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.finish_update(token uuid)
returns table (resource text, enabled boolean, outcome text)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_item record;
  v_outcome text;
  v_restored text[] := '{}'::text[];
  v_layer regproc;
begin
  perform pgfence.check_not_null('token', finish_update.token);
  -- The update row first, then the resource rows in name order (the shared lock order).
  perform from pgfence.updates u where u.token = finish_update.token for update;
  if not found then
    perform pgfence.update_not_found(finish_update.token);
  end if;
  perform pgfence.lock_resources(array(select i.resource from pgfence.update_items i
                                        where i.token = finish_update.token));

  for v_item in
    select i.resource, i.saved_enabled, i.enabled_version, i.outcome, r.enabled_version as current_version
      from pgfence.update_items i join pgfence.resources r on r.resource = i.resource
     where i.token = finish_update.token
     order by i.resource
  loop
    if v_item.outcome is not null then
      v_outcome := 'already_finished';
    elsif v_item.current_version <> v_item.enabled_version then
      -- Someone set enabled inside the window: theirs is the newer decision. Leave it.
      v_outcome := 'conflict';
    elsif v_item.saved_enabled then
      update pgfence.resources r
         set enabled = true, enabled_version = r.enabled_version + 1
       where r.resource = v_item.resource;
      v_restored := v_restored || v_item.resource;
      v_outcome := 'restored';
    else
      -- It was disabled before the window: it stays disabled (I6).
      v_outcome := 'kept_disabled';
    end if;
    if v_outcome <> 'already_finished' then
      update pgfence.update_items i set outcome = v_outcome
       where i.token = finish_update.token and i.resource = v_item.resource;
    end if;
    resource := v_item.resource;
    enabled := (select r.enabled from pgfence.resources r where r.resource = v_item.resource);
    outcome := v_outcome;
    return next;
  end loop;
  if cardinality(v_restored) > 0 then
    perform pgfence.enabled_changed(v_restored);
  end if;
  -- The names a layer took into the window (window_prepare), restored by the layer by the
  -- same rules.
  for v_layer in select l.window_finish::regprocedure::oid::regproc from pgfence.layers l
                  where l.window_finish is not null order by l.schema_name loop
    return query execute format('select f.resource, f.enabled, f.outcome from %s($1) f', v_layer)
      using finish_update.token;
  end loop;
  update pgfence.updates u set finished_at = clock_timestamp()
   where u.token = finish_update.token and u.finished_at is null;
end
$$;
comment on function pgfence.finish_update(uuid) is
  'Operator: closes an update window, restoring exactly the saved enabled values (a layer''s names by the layer: '
  'window_finish): restored, kept_disabled, conflict '
  '(enabled was changed inside the window: left as it is) or already_finished (idempotent). Raises PF005.';

revoke all on function pgfence.finish_update(uuid) from public;
grant execute on function pgfence.finish_update(uuid) to pgfence_operator;

commit;

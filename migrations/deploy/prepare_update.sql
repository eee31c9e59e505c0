-- Deploy pgfence:prepare_update
-- requires: ref
-- requires: lock_resources
-- requires: updates
-- requires: leases
-- requires: invocations
-- requires: checks
-- requires: errors
-- requires: layer_hooks
--
-- Reworked in 0.3.0: names that are no pgfence resource are offered to the layers (their
-- window_prepare hook: an unconverted pgflow worker function), and the layers are told of
-- the resources it disabled (enabled_changed).

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.prepare_update(resources text[], request_id uuid)
returns uuid
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_set text[];
  v_found text[];
  v_missing text[];
  v_existing pgfence.updates;
  v_open text;
  v_token uuid;
  v_resource record;
  v_version bigint;
  v_drained bigint;
  v_layer regproc;
  v_taken text[];
begin
  perform pgfence.check_not_null('request_id', prepare_update.request_id);
  if prepare_update.resources is null or cardinality(prepare_update.resources) not between 1 and 1000
     or array_position(prepare_update.resources, null) is not null then
    perform pgfence.invalid_argument('resources', 'must name 1 to 1000 resources, none NULL',
                                     prepare_update.resources::text);
  end if;
  perform pgfence.check_name('resources', r) from unnest(prepare_update.resources) r;
  select array_agg(distinct r order by r) into v_set from unnest(prepare_update.resources) r;
  if cardinality(v_set) <> cardinality(prepare_update.resources) then
    perform pgfence.invalid_argument('resources',
      'names ' || (select string_agg(r, ', ') from (select r from unnest(prepare_update.resources) r
                                                     group by r having count(*) > 1 order by r) d)
               || ' more than once',
      prepare_update.resources::text);
  end if;

  -- Claim the request_id first (the update row comes first in the lock order). A concurrent
  -- prepare with the same request_id waits here until this one commits or rolls back.
  insert into pgfence.updates as u (token, request_id, resources)
  values (gen_random_uuid(), prepare_update.request_id, v_set)
  on conflict on constraint updates_request_id_key do nothing
  returning u.token into v_token;
  if v_token is null then
    -- A retry after a lost response gets the original window back, untouched: saving the
    -- temporary false now would lose the state to restore.
    select * into v_existing from pgfence.updates u where u.request_id = prepare_update.request_id;
    if v_existing.resources <> v_set then
      -- The request id and the token are named by their digests: either gets the window.
      raise exception 'pgfence: request_id ref % was used for another set of resources', pgfence.ref(prepare_update.request_id)
        using errcode = 'PF004', detail = format('update ref %s covers %s', pgfence.ref(v_existing.token),
                                                 array_to_string(v_existing.resources, ', ')),
              hint = 'use a new request_id for a new update';
    end if;
    return v_existing.token;
  end if;

  -- Then the resources, in name order, before looking at anything else.
  perform pgfence.lock_resources(v_set);
  select array_agg(x.resource order by x.resource) into v_found
    from pgfence.resources x where x.resource = any (v_set);
  select array_agg(r order by r) into v_missing from unnest(v_set) r where r <> all (coalesce(v_found, '{}'));
  -- A name that is no resource may be a layer's (an unconverted pgflow worker function): each
  -- layer's window_prepare takes those it manages, saving and pausing them by the same rules,
  -- in this transaction. What nobody takes is unknown, and everything is rolled back.
  for v_layer in select l.window_prepare::regprocedure::oid::regproc from pgfence.layers l
                  where l.window_prepare is not null order by l.schema_name loop
    exit when v_missing is null;
    execute format('select array(select n from %s($1, $2) n)', v_layer) into v_taken using v_token, v_missing;
    select array_agg(r order by r) into v_missing from unnest(v_missing) r where r <> all (v_taken);
  end loop;
  if v_missing is not null then
    raise exception 'pgfence: unknown resources: %', array_to_string(v_missing, ', ')
      using errcode = 'PF002', hint = 'nothing was changed; register them or fix the names';
  end if;

  select string_agg(format('%s (update ref %s)', i.resource, pgfence.ref(i.token)), ', ' order by i.resource) into v_open
    from pgfence.update_items i
   where i.resource = any (v_set) and i.outcome is null;
  if v_open is not null then
    raise exception 'pgfence: resources already in an open update: %', v_open
      using errcode = 'PF004', hint = 'finish that update first: pgfence.finish_update(token)';
  end if;

  for v_resource in
    select r.resource, r.enabled from pgfence.resources r where r.resource = any (v_set) order by r.resource
  loop
    update pgfence.resources r
       set enabled = false, enabled_version = r.enabled_version + 1
     where r.resource = v_resource.resource
    returning r.enabled_version into v_version;
    -- The active lease stops claiming; FOR UPDATE waits for its open fenced transactions.
    select l.generation into v_drained
      from pgfence.leases l
     where l.resource = v_resource.resource and l.state = 'active'
       for update;
    if found then
      update pgfence.leases l set state = 'draining', drained_at = clock_timestamp()
       where l.resource = v_resource.resource and l.generation = v_drained;
    end if;
    insert into pgfence.update_items (token, resource, saved_enabled, enabled_version, drained_generation,
                                      pending_invocations)
    values (v_token, v_resource.resource, v_resource.enabled, v_version, v_drained,
            (select count(*) from pgfence.invocations i
              where i.resource = v_resource.resource and i.acknowledged_at is null
                and i.expires_at > clock_timestamp()));
  end loop;
  if v_found is not null then
    perform pgfence.enabled_changed(v_found);
  end if;
  return v_token;
end
$$;
comment on function pgfence.prepare_update(text[], uuid) is
  'Operator: opens an update window over resources (and names a layer manages: window_prepare): saves each one''s exact '
  'enabled, disables them, drains their active leases; '
  'returns the token. A retry with the same request_id and set returns the same token and changes nothing. '
  'Raises 22023 (bad set), PF002 (unknown names, listed), PF004 (overlap with an open window, or request_id reused for another set).';

revoke all on function pgfence.prepare_update(text[], uuid) from public;
grant execute on function pgfence.prepare_update(text[], uuid) to pgfence_operator;

commit;

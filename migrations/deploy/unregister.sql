-- Deploy pgfence:unregister
-- requires: resources
-- requires: leases
-- requires: invocations
-- requires: updates
-- requires: protections
-- requires: layers
-- requires: lock_resources
-- requires: lease_judgement
--
-- Retention of resources (issue 43 item 4): none by age. A resource is what an operator
-- registered (register is the operator's from 0.3.0 on), named by protections, windows and
-- workers' configuration; one unused for any length of time is normal (a monthly job, workers
-- down for a week), and forgetting it would make its next acquire fail PF002. So a resource
-- goes only when an operator unregisters it, and only when nothing uses it.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Removes a resource and its ended history (its leases, invocations and the items of finished
-- windows), or refuses (55000, naming each) while anything uses it: a lease not ended (active
-- or draining, unexpired), a queued or claimed task or a layer's unfinished work under one of
-- its leases (a late result is judged against that lease), a pending invocation, an open
-- update window, a protection. Generations come from one sequence for every resource and lease
-- ids are random, so a name registered again continues above every generation it had, and no
-- id of the removed leases is valid again (I3). True when it removed the resource, false when
-- there was none (a retry).
create function pgfence.unregister(resource text)
returns boolean
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
declare
  v_leases uuid[];
  v_needed uuid[];
  v_more uuid[];
  v_layer regproc;
  v_found text[];
begin
  perform pgfence.check_name('resource', unregister.resource);
  -- The row first (a bounded wait, naming the holder): acquire and request_start of the name
  -- wait for it, or answer NULL, until this transaction ends.
  perform pgfence.lock_resources(array[unregister.resource]);
  if not exists (select from pgfence.resources r where r.resource = unregister.resource) then
    return false;
  end if;
  -- Its leases, locked as drain and release lock them: a fenced transaction still open under
  -- one of them is waited for.
  v_leases := array(select l.lease_id from pgfence.leases l where l.resource = unregister.resource
                     order by l.lease_id for update);
  v_needed := array(select distinct x.id
                      from pgfence.tasks t
                     cross join lateral unnest(t.attempt_leases || t.lease_id) x(id)
                     where t.state in ('queued', 'claimed') and x.id = any (v_leases));
  for v_layer in select l.leases::regprocedure::oid::regproc from pgfence.layers l order by l.schema_name loop
    execute pg_catalog.format('select array(select * from %s())', v_layer) into v_more;
    v_needed := v_needed || array(select x from unnest(v_more) x where x = any (v_leases));
  end loop;
  v_found := array_remove(array[
    (select format('its lease of generation %s is %s', l.generation, l.state)
       from pgfence.leases l
      where l.resource = unregister.resource and pgfence.is_live(l.state, l.expires_at)
      order by l.generation desc limit 1),
    (select format('%s task(s) or layer work not finished under its leases (generations %s)',
                   cardinality(v_needed), string_agg(l.generation::text, ', ' order by l.generation))
       from pgfence.leases l where l.lease_id = any (v_needed) having count(*) > 0),
    (select format('%s pending invocation(s)', count(*))
       from pgfence.invocations i
      where i.resource = unregister.resource and i.acknowledged_at is null and i.expires_at > clock_timestamp()
     having count(*) > 0),
    (select 'an open update window' from pgfence.update_items i
      where i.resource = unregister.resource and i.outcome is null limit 1),
    (select format('protections of %s', string_agg(p.tbl::text, ', ' order by p.tbl::text))
       from pgfence.protections p where unregister.resource = any (p.resources) having count(*) > 0)],
    null);
  if cardinality(v_found) > 0 then
    raise exception 'pgfence: resource % is in use: %', unregister.resource, array_to_string(v_found, '; ')
      using errcode = '55000',
            hint = 'end its lease (deprecate), let its work finish, finish its window or unprotect its tables, then unregister it';
  end if;
  delete from pgfence.update_items i where i.resource = unregister.resource;
  delete from pgfence.invocations i where i.resource = unregister.resource;
  delete from pgfence.leases l where l.resource = unregister.resource;
  delete from pgfence.resources r where r.resource = unregister.resource;
  return true;
end
$$;
comment on function pgfence.unregister(text) is
  'Operator: removes a resource nothing uses, with its ended history; true if removed, false if not registered. '
  'Raises 55000 naming what uses it, 22023 on a bad name.';

revoke all on function pgfence.unregister(text) from public;
grant execute on function pgfence.unregister(text) to pgfence_operator;

commit;

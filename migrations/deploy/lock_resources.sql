-- Deploy pgfence:lock_resources
-- requires: resources
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Locks resource rows FOR NO KEY UPDATE, in name order (the shared lock order), for the paths
-- that must wait for them: the operator's and a worker started for an invocation. Any session
-- can hold a resource row (acquire takes it), and one that then idles, or prepares its
-- transaction, would keep every such path waiting without an end; so the wait is bounded by
-- the caller's lock_timeout, or 5 seconds when it has none, and a timeout names who holds the
-- rows, which an operator needs to act on.
create function pgfence.lock_resources(resources text[])
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_saved text := current_setting('lock_timeout');
  v_holders text;
begin
  if v_saved = '0' then
    perform set_config('lock_timeout', '5s', true);
  end if;
  begin
    perform from pgfence.resources r
     where r.resource = any (lock_resources.resources)
     order by r.resource
       for no key update;
  exception when lock_not_available then
    -- A locked row's xmax is its locker's transaction id (a multixact when several share it).
    select string_agg(format('%s: %s', r.resource,
                             coalesce(
                               (select format('prepared transaction %L', x.gid)
                                  from pg_catalog.pg_prepared_xacts x where x.transaction = r.xmax),
                               (select format('pid %s (%s, %s since %s)', a.pid,
                                              coalesce(nullif(a.application_name, ''), 'no application_name'),
                                              a.state, a.state_change)
                                  from pg_catalog.pg_locks k
                                  join pg_catalog.pg_stat_activity a on a.pid = k.pid
                                 where k.locktype = 'transactionid' and k.transactionid = r.xmax
                                   and k.granted
                                 limit 1),
                               'a transaction that has ended, or several sharing the lock')), '; ' order by r.resource)
      into v_holders
      from pgfence.resources r
     where r.resource = any (lock_resources.resources) and r.xmax <> '0'::xid;
    raise exception 'pgfence: resources are locked by another transaction; gave up after lock_timeout %',
                    current_setting('lock_timeout')
      using errcode = '55P03', detail = coalesce(v_holders, 'the holder has gone since'),
            hint = 'retry; if the holder is idle or a forgotten prepared transaction, end it '
                   '(pg_terminate_backend, ROLLBACK PREPARED)';
  end;
  perform set_config('lock_timeout', v_saved, true);
end
$$;
comment on function pgfence.lock_resources(text[]) is
  'Locks the resource rows in name order, waiting at most lock_timeout (5 s when unset); raises 55P03 naming who holds them.';

revoke all on function pgfence.lock_resources(text[]) from public;

commit;

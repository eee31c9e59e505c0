-- Deploy pgfence:check_revert
-- requires: releases
--
-- A revert that will refuse refuses before anything is reverted (issue 43 item 2). Sqitch
-- reverts one change per transaction, latest first, and tells a revert script nothing of where
-- the revert ends: a step that refuses (the reverts of claim, report, complete and extend while
-- tasks claimed under 0.2.0 are live, say) used to stop the revert with every later change
-- reverted already. So the first step of every revert from 0.3.0 on, the revert of the release's
-- own change (release_X, kept last in the plan), asks this function first. It knows the target
-- only if the operator says it (`sqitch revert --to @vA --set pgfence_revert_to=A`: Sqitch
-- passes --set variables to psql, its pg engine nothing else but ON_ERROR_STOP and the
-- registry's name); without it, it checks for the deepest revert there is, to nothing.

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Everything a revert to to_release (NULL: every change) would strand, in one 55000 that names
-- each; nothing otherwise. The rules are those of the steps that refuse later in such a revert
-- (the released revert scripts keep their own checks), and what no step checked: a layer left
-- on a core older than it needs. Claims are held off while it runs (a share lock on the tasks,
-- as those steps take), not for the rest of the revert: pause the queues first.
create function pgfence.check_revert(to_release text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
  v_to int[];
  v_found text[] := '{}'::text[];
  v_n bigint;
  v_list text;
begin
  if check_revert.to_release !~ '^@?v?\d+\.\d+\.\d+$' then
    perform pgfence.invalid_argument('to_release', 'must be a release, X.Y.Z (or @vX.Y.Z)', check_revert.to_release);
  end if;
  v_to := coalesce(string_to_array(regexp_replace(check_revert.to_release, '^@?v?', ''), '.')::int[], '{0,0,0}');
  lock table pgfence.tasks in share mode;

  -- A layer runs on the core release it came with or a later one: its revert (its own Sqitch
  -- project) goes first. From 0.3.0 on a layer's release is recorded (pgfence.seal), and its
  -- own revert needs the core's pgfence.unseal; every layer needs at least pgfence 0.2.0.
  select string_agg(format('layer %s holds release %s: revert it first (cd layers/%s && sqitch revert --to @v%s)',
                           l.schema_name, r.release, substr(l.schema_name, 9),
                           array_to_string(v_to, '.')), '; ' order by l.schema_name)
    into v_list
    from pgfence.layers l
    cross join lateral (select pgfence.installed_release(l.schema_name) as release) r
   where string_to_array(coalesce(r.release, '0.2.0'), '.')::int[] > v_to
     and v_to >= '{0,2,0}';
  v_found := v_found || v_list;  -- NULL when none: removed below
  if v_to < '{0,2,0}' then
    select string_agg(format('layer %s is installed (it needs pgfence 0.2.0): revert it first (cd layers/%s && sqitch revert)',
                             l.schema_name, substr(l.schema_name, 9)), '; ' order by l.schema_name)
      into v_list
      from pgfence.layers l;
    v_found := v_found || v_list;  -- NULL when none: removed below

    -- Attempt ids of tasks claimed under 0.2.0 are signed with HMAC-SHA256, which 0.1.0 cannot
    -- verify (0.2.0 records each attempt's lease, which tells them from 0.1.0's claims).
    select count(*), string_agg(distinct t.queue, ', ') into v_n, v_list
      from pgfence.tasks t
     where t.state = 'claimed' and t.attempt_leases[t.attempt] is not null;
    if v_n > 0 then
      v_found := v_found || format('%s task(s) claimed under 0.2.0 (queues %s) would no longer be completed, '
                                   'failed or extended under release 0.1.0: let them finish, or pause their '
                                   'resources (pgfence.prepare_update) until update_status says drained',
                                   v_n, v_list);
    end if;
    select count(*) into v_n from pgfence.stale_results s where s.report > 1;
    if v_n > 0 then
      v_found := v_found || format('it would delete %s stale-result record(s) (later reports of one stale attempt, '
                                   'report > 1): copy them elsewhere and delete them', v_n);
    end if;
    select string_agg(p.tbl::text, ', ' order by p.tbl::text) into v_list
      from pgfence.protections p where cardinality(p.resources) > 1;
    if v_list is not null then
      v_found := v_found || format('tables protected for several resources (%s): protect each for one first', v_list);
    end if;
  end if;

  v_found := array_remove(v_found, null);
  if cardinality(v_found) > 0 then
    raise exception 'pgfence: a revert to % would strand live state; nothing was reverted',
                    coalesce(check_revert.to_release, 'nothing')
      using errcode = '55000', detail = array_to_string(v_found, E';\n'),
            hint = case when check_revert.to_release is null
                        then 'Sqitch does not tell a revert where it ends: these are what a revert of every change '
                             'would strand. Reverting to a release? Say which: sqitch revert --to @vA '
                             '--set pgfence_revert_to=A'
                        else 'deal with each, then revert again' end;
  end if;
end
$$;
comment on function pgfence.check_revert(text) is
  'Installer: raises 55000 naming everything a revert to to_release (NULL: every change) would strand; the first '
  'step of every revert (release_X''s) calls it before anything is reverted.';

revoke all on function pgfence.check_revert(text) from public;

commit;

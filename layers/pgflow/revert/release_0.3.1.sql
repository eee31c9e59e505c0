-- Revert pgfence_pgflow:release_0.3.1
--
-- The first step of every revert of the layer from release 0.3.1: what a later step would
-- refuse is refused here, before anything is reverted (as the core's pgfence.check_revert
-- does for the core's steps). pgflow_windows' revert refuses while a window holds one of the
-- layer's functions (its saved enabled would be lost); reached there, the changes after it
-- (the cron record, the workers' hooks) would be reverted already.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
declare
  v_open text;
begin
  select string_agg(w.function_name, ', ' order by w.function_name) into v_open
    from pgfence_pgflow.windows w where w.outcome is null;
  if v_open is not null then
    raise exception 'pgfence: a revert of the pgflow layer would strand an open update window; nothing was reverted'
      using errcode = '55000',
            detail = format('pgflow worker functions in an open window: %s', v_open),
            hint = 'finish the window first (pgfence.finish_update), then revert';
  end if;
end
$$;
do $$ begin perform pgfence.unseal('pgfence_pgflow', '0.3.1'); end $$;

commit;

-- Revert pgfence_pgflow:pgflow_windows
--
-- Refused while a window holds a function of the layer's: its saved enabled would be lost, and
-- the function left paused for ever.

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
    raise exception 'pgfence: pgflow worker functions are in an open update window: %', v_open
      using errcode = '55000', hint = 'finish the window first (pgfence.finish_update), then revert';
  end if;
end
$$;

update pgfence.layers set window_prepare = null, window_status = null, window_finish = null
 where schema_name = 'pgfence_pgflow';
drop function pgfence_pgflow.window_finish(uuid);
drop function pgfence_pgflow.window_status(uuid, text[]);
drop function pgfence_pgflow.window_prepare(uuid, text[]);
drop table pgfence_pgflow.windows;

commit;

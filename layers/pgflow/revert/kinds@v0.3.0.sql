-- Revert pgfence_pgflow:kinds

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  perform pgfence.set_kind(null, variadic array_agg(p.oid::regprocedure))
     from pg_proc p
    where p.pronamespace = 'pgfence_pgflow'::regnamespace
      and obj_description(p.oid, 'pg_proc') ~ '^(Hook|Private):';
end
$$;

commit;

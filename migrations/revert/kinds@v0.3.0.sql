-- Revert pgfence:kinds: the kinds it wrote go from the comments (seal, lockdown and the other
-- installer functions say "Installer:" in their own scripts, and keep it), then set_kind

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$
begin
  perform pgfence.set_kind(null, variadic array_agg(p.oid::regprocedure))
     from pg_proc p
    where p.pronamespace = 'pgfence'::regnamespace
      and obj_description(p.oid, 'pg_proc') ~ '^(Layers|Private):';
  perform pgfence.set_kind(null, 'pgfence.installed_release(name)', 'pgfence.schema_drift(name)',
                           'pgfence.schema_fingerprint(name)');
end
$$;
drop function pgfence.set_kind(text, regprocedure[]);

commit;

-- Revert pgfence:lockdown
-- Revoked privileges were never pgfence's to give: only the function goes.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

delete from pgfence.manifest where object = 'function pgfence.lockdown(schema_name name)';
drop function if exists pgfence.lockdown(name);

commit;

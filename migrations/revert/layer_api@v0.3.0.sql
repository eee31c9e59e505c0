-- Revert pgfence:layer_api

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.prune_attempts(regclass, regclass, name, interval, uuid[]);
drop function pgfence.limit_lock_wait();
drop function pgfence.owner_ref(uuid, text);
drop function pgfence.lease_facts(uuid[]);
drop function pgfence.mark_guards(regclass[]);
drop function pgfence.mark_lease(uuid, regclass);
drop function pgfence.hold_fenced(uuid);

commit;

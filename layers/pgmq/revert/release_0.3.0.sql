-- Revert pgfence_pgmq:release_0.3.0

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

do $$ begin perform pgfence.unseal('pgfence_pgmq', '0.3.0'); end $$;

commit;

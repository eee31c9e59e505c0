-- Revert pgfence:kinds from 0.3.1: nothing. The kinds are the ones 0.3.0 wrote, and stay
-- (layer_api's revert keeps the comment of the function it puts back).

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

commit;

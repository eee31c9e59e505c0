-- Revert pgfence:release_0.3.1
--
-- The first step of every revert from release 0.3.1: whatever the revert would strand further
-- down refuses it here, before anything is reverted (pgfence.check_revert). Sqitch does not
-- tell a script where the revert ends; the operator may (`--set pgfence_revert_to=A`), else
-- the check is for a revert of every change.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

\if :{?pgfence_revert_to}
select pgfence.check_revert(:'pgfence_revert_to');
\else
select pgfence.check_revert(null);
\endif
do $$ begin perform pgfence.unseal('pgfence', '0.3.1'); end $$;

commit;

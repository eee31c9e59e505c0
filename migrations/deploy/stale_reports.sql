-- Deploy pgfence:stale_reports
-- requires: stale_results

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- A stale attempt may report more than once (a retry, or a fail after a complete): each
-- different report is kept (I5: never silently dropped), numbered per attempt.
-- stale_results holds only refused results, a small table: the key is rebuilt under its lock
-- (the old key, on attempt_id alone, is what dropped a second report).
-- squawk-ignore ban-drop-constraint
alter table pgfence.stale_results drop constraint stale_results_pkey;
alter table pgfence.stale_results add column report int not null default 1;
-- squawk-ignore constraint-missing-not-valid,adding-serial-primary-key-field
alter table pgfence.stale_results add constraint stale_results_pkey primary key (attempt_id, report);
-- The bound on what one task attempt may store is counted by this index.
-- squawk-ignore require-concurrent-index-creation
create index stale_results_task_attempt on pgfence.stale_results (task_id, attempt);
-- An attempt id is its holder's capability, also once superseded (it still files reports):
-- monitors and operators read every column but attempt_id; task_id and attempt name the
-- attempt for them.
revoke select on table pgfence.stale_results from pgfence_monitor, pgfence_operator;
grant select (task_id, attempt, kind, body, received_at, report) on table pgfence.stale_results
   to pgfence_monitor, pgfence_operator;

commit;

-- Revert pgfence_pgmq:lockdown
-- Nothing to undo: revoked privileges were never the layer's to give.

begin;

select 1;

commit;

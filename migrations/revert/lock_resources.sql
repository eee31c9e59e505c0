-- Revert pgfence:lock_resources

begin;

drop function pgfence.lock_resources(text[]);

commit;

-- Revert pgfence:errors

begin;

drop function pgfence.update_not_found(uuid);
drop function pgfence.unknown_attempt(uuid);
drop function pgfence.resource_not_found(text);
drop function pgfence.lease_not_current(uuid, timestamptz);
drop function pgfence.invalid_argument(text, text, text);

commit;

-- Revert pgfence:attempt_id

begin;

drop function pgfence.attempt_of(uuid);
drop function pgfence.attempt_task(uuid);
drop function pgfence.attempt_uuid(bigint, int, uuid);
drop function pgfence.attempt_uuid(bigint, int, uuid, bytea);

commit;

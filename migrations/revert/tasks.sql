-- Revert pgfence:tasks

begin;

drop function pgfence.requeue_expired(int);
drop function pgfence.extend(uuid, interval);
drop function pgfence.fail(uuid, jsonb);
drop function pgfence.complete(uuid, jsonb);
drop function pgfence.report(uuid, text, jsonb);
drop function pgfence.claim(uuid, text, int, interval);
drop function pgfence.enqueue(text, jsonb, int);
drop function pgfence.unknown_attempt(uuid);
drop function pgfence.attempt_of(uuid);
drop function pgfence.attempt_task(uuid);
drop function pgfence.attempt_uuid(bigint, int, uuid);
drop function pgfence.attempt_uuid(bigint, int, uuid, bytea);
drop table pgfence.stale_results;
drop table pgfence.tasks;

commit;

-- Revert pgfence:extend

begin;

drop function pgfence.extend(uuid, interval);

commit;

-- Revert pgfence:lease_judgement

begin;

drop function pgfence.hold_current(uuid);
drop function pgfence.is_live(text, timestamptz);
drop function pgfence.is_current(text, timestamptz);

commit;

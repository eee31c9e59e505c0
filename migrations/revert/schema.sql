-- Revert pgfence:schema
-- No cascade: every later change reverts its own objects, and this fails if one did not.

begin;

drop function pgfence.check_not_null(text, anyelement);
drop function pgfence.check_interval(text, interval);
drop function pgfence.check_label(text, text);
drop function pgfence.check_name(text, text);
drop function pgfence.invalid_argument(text, text, text);
drop schema pgfence;

commit;

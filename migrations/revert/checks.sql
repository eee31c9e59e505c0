-- Revert pgfence:checks

begin;

drop function pgfence.check_not_null(text, anyelement);
drop function pgfence.check_interval(text, interval);
drop function pgfence.check_label(text, text);
drop function pgfence.check_name(text, text);

commit;

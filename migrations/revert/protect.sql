-- Revert pgfence:protect
-- Tables still protected keep a trigger that calls pgfence.guard(): unprotect them first.

begin;

revoke execute on function pgfence.check_name(text, text), pgfence.check_not_null(text, anyelement),
                           pgfence.invalid_argument(text, text, text), pgfence.resource_not_found(text)
    from pgfence_operator;
revoke select on table pgfence.resources from pgfence_operator;
drop function pgfence.unprotect(regclass);
drop function pgfence.protect(regclass, text, text);
drop function pgfence.guard();
drop table pgfence.unfenced_writes;

commit;

-- Revert pgfence:protect
-- Tables still protected keep a trigger that calls pgfence.guard(): unprotect them first.

begin;

drop function pgfence.unprotect(regclass);
drop function pgfence.protect(regclass, text, text);
drop function pgfence.guard();

commit;

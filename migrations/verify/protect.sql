-- Verify pgfence:protect
select 'pgfence.protect(regclass, text, text)'::regprocedure, 'pgfence.protect(regclass, text[], text, boolean)'::regprocedure, 'pgfence.unprotect(regclass)'::regprocedure,
       'pgfence.guard()'::regprocedure;

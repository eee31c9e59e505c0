-- Verify pgfence:protect
select 'pgfence.protect(regclass, text, text)'::regprocedure, 'pgfence.unprotect(regclass)'::regprocedure,
       'pgfence.guard()'::regprocedure;
select id, table_name, resource, operation, mode, transaction_id, role_name, application_name, at
  from pgfence.unfenced_writes where false;

-- Verify pgfence:unfenced_writes
select id, table_name, resource, operation, mode, transaction_id, role_name, application_name, at
  from pgfence.unfenced_writes where false;

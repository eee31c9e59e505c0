-- Verify pgfence:protected_tables
select table_name, resources, mode, guard_present, guard_enabled, plain_table, healthy, problem
  from pgfence.protected_tables where false;

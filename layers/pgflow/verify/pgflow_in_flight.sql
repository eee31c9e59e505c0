-- Verify pgfence_pgflow:pgflow_in_flight
select 1 / count(*)::int from pgfence.layers where schema_name = 'pgfence_pgflow' and in_flight::regprocedure = 'pgfence_pgflow.in_flight()'::regprocedure and leases::regprocedure = 'pgfence_pgflow.leases()'::regprocedure;
select 'pgfence_pgflow.open_starts()'::regprocedure;

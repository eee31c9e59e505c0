-- Verify pgfence_pgmq:in_flight
select 1 / count(*)::int from pgfence.layers where schema_name = 'pgfence_pgmq' and in_flight::regprocedure = 'pgfence_pgmq.in_flight(text[])'::regprocedure and leases::regprocedure = 'pgfence_pgmq.leases()'::regprocedure;

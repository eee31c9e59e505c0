-- Verify pgfence_pgmq:in_flight
select 1 / count(*)::int from pgfence.layers where schema_name = 'pgfence_pgmq' and in_flight::regprocedure = 'pgfence_pgmq.in_flight()'::regprocedure and leases::regprocedure = 'pgfence_pgmq.leases()'::regprocedure;
select 'pgfence_pgmq.open_reads()'::regprocedure;

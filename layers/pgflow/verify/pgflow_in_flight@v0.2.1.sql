-- Verify pgfence_pgflow:pgflow_in_flight (release 0.2.1's instance; also run by `sqitch deploy
-- --log-only` over a later release, whose in_flight takes no argument: either is registered)
select 1 / count(*)::int from pgfence.layers
 where schema_name = 'pgfence_pgflow'
   and in_flight::regprocedure in (to_regprocedure('pgfence_pgflow.in_flight(text[])'),
                                   to_regprocedure('pgfence_pgflow.in_flight()'))
   and leases::regprocedure = 'pgfence_pgflow.leases()'::regprocedure;

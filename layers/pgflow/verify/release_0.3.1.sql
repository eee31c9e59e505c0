-- Verify pgfence_pgflow:release_0.3.1
-- Release 0.3.1 is sealed here: true over any later release too, as `sqitch deploy --log-only`
-- (adopting a one-file install of a later release) runs this script over it.
select 1 / (exists (select from pgfence.releases
                    where schema_name = 'pgfence_pgflow' and release = '0.3.1'))::int;
select 1 / (not exists (select from pgfence.schema_drift('pgfence_pgflow')))::int;

-- Baseline of claim.sql, fencing alone: the same function on the same table without the
-- ownership check (bench.claim, derived from pgfence.claim by bench/setup.sql).
select * from bench.claim(md5('bench-claim')::uuid, 'bench', 10, interval '1 hour');

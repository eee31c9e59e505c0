-- pgfence: a transaction that fences and inserts 100 rows into a protected table.
begin;
select pgfence.fence(md5('bench-fence')::uuid) as generation \gset
insert into bench.fenced_rows (generation, payload)
select :generation, jsonb_build_object('amount', g) from generate_series(1, 100) g;
commit;

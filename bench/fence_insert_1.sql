-- pgfence: a transaction that fences and inserts 1 row into a protected table.
begin;
select pgfence.fence(md5('bench-fence')::uuid) as generation \gset
insert into bench.fenced_rows (generation, payload) values (:generation, '{"amount": 42}');
commit;

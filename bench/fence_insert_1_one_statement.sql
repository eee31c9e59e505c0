-- pgfence: the transaction of fence_insert_1.sql with the fence in the insert itself (the
-- guard checks at the end of each statement), one round trip fewer.
begin;
insert into bench.fenced_rows (generation, payload)
select pgfence.fence(md5('bench-fence')::uuid), '{"amount": 42}';
commit;

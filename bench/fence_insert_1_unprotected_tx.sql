-- The transaction of fence_insert_1.sql into an unprotected table: pgfence.fence's cost in
-- the two-statement form, without the guard's.
begin;
select pgfence.fence(md5('bench-fence')::uuid) as generation \gset
insert into bench.plain_rows (generation, payload) values (:generation, '{"amount": 42}');
commit;

-- Baseline of fence_insert_1.sql: the same transaction without fence, on an unprotected table.
begin;
insert into bench.plain_rows (generation, payload) values (1, '{"amount": 42}');
commit;

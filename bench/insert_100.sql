-- Baseline of fence_insert_100.sql: the same transaction without fence, on an unprotected table.
begin;
insert into bench.plain_rows (generation, payload)
select 1, jsonb_build_object('amount', g) from generate_series(1, 100) g;
commit;

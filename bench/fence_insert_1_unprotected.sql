-- pgfence.fence in the writing statement, into an unprotected table: the function's cost
-- without the guard's.
begin;
insert into bench.plain_rows (generation, payload)
select pgfence.fence(md5('bench-fence')::uuid), '{"amount": 42}';
commit;

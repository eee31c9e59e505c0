-- Empty tables for a round of fenced and plain inserts. Truncating a protected table is a
-- protected write too: it fences first.
begin;
select pgfence.fence(md5('bench-fence')::uuid) as generation \gset
truncate bench.fenced_rows, bench.plain_rows restart identity;
commit;
vacuum analyze bench.fenced_rows, bench.plain_rows;

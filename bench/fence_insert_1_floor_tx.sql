-- The floor of fence_insert_1.sql (issue 18): the same transaction, fence and write in two
-- statements, with the fence written by hand (the lease row locked FOR KEY SHARE and judged,
-- no function around it), into an unprotected table of the same shape.
begin;
select l.generation
  from pgfence.leases l
 where l.lease_id = md5('bench-fence')::uuid and l.state = 'active' and l.expires_at > clock_timestamp()
   for key share \gset
insert into bench.plain_rows (generation, payload) values (:generation, '{"amount": 42}');
commit;

-- The floor of fenced writes (issue 18): the fence a careful user writes inline with table
-- rights, the same row lock and judgement as pgfence.fence and no function around them, into
-- an unprotected table of the same shape, in one statement.
begin;
insert into bench.plain_rows (generation, payload)
select l.generation, '{"amount": 42}'
  from pgfence.leases l
 where l.lease_id = md5('bench-fence')::uuid and l.state = 'active' and l.expires_at > clock_timestamp()
   for key share;
commit;

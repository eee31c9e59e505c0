-- The floor of claim (issue 18): the same claim (bench.claim, pgfence.claim without its check)
-- with the lease check written inline in the same statement: the lease row locked FOR KEY
-- SHARE and judged, no function around it.
select c.*
  from (select 1 from pgfence.leases l
         where l.lease_id = md5('bench-claim')::uuid and l.state = 'active' and l.expires_at > clock_timestamp()
           for key share) ok,
       lateral bench.claim(md5('bench-claim')::uuid, 'bench', 10, interval '1 hour') c;

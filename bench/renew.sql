-- pgfence: renew one of 1,000 leases.
\set r random(1, 1000)
select * from pgfence.renew(md5('renew-' || :r)::uuid, interval '1 hour');

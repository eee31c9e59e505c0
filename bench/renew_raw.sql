-- Baseline of renew.sql: a raw single-row UPDATE by key on a copy of the lease table.
\set r random(1, 1000)
update bench.leases_raw l
   set expires_at = clock_timestamp() + interval '1 hour', renewed_at = clock_timestamp()
 where l.lease_id = md5('renew-' || :r)::uuid
returning l.expires_at, l.state;

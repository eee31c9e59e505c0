-- The floor of renew (issue 18): a hand-written renewal with renew's judgement (active or
-- draining, not expired) and its rule (never shorten the lease), on the copy of the lease table.
\set r random(1, 1000)
update bench.leases_raw l
   set expires_at = greatest(l.expires_at, clock_timestamp() + interval '1 hour'), renewed_at = clock_timestamp()
 where l.lease_id = md5('renew-' || :r)::uuid and l.state in ('active', 'draining') and l.expires_at > clock_timestamp()
returning l.expires_at, l.state;

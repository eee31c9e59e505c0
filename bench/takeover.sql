-- pgfence: a takeover. Leases last 1 microsecond, so every acquire of a resource finds the
-- previous lease expired, supersedes it and grants the next generation. 100 resources per
-- client: clients never wait for each other.
\set r random(1, 100)
select * from pgfence.acquire('cycle-' || :client_id || '-' || :r, 'client-' || :client_id, interval '1 microsecond');

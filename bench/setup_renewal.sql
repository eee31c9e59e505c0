-- Fixtures for the renewal property (scripts/bench): 1,000 leases in an otherwise empty
-- pgfence, with lease_id = md5(resource)::uuid as in setup.sql, so renew.sql runs unchanged.
select count(pgfence.register('renew-' || g)) from generate_series(1, 1000) g;
select count(pgfence.acquire('renew-' || g, 'bench', interval '1 day')) from generate_series(1, 1000) g;
update pgfence.leases set lease_id = md5(resource)::uuid;
vacuum analyze pgfence.leases;

-- The renewals themselves, for bench/renew_batch.sql: n calls of pgfence.renew on a random one
-- of the 1,000 leases, each in a transaction of its own (the procedure commits after each), so
-- that a million renewals need no million client round trips.
create schema bench;
create procedure bench.renew_batch(n int)
language plpgsql
as $$
begin
  for i in 1 .. n loop
    perform pgfence.renew(md5('renew-' || (1 + floor(random() * 1000))::int)::uuid, interval '1 hour');
    commit;
  end loop;
end
$$;

-- The renewal property (scripts/bench): :n renewals, each its own transaction, of random
-- leases of the 1,000 (procedure bench.renew_batch of bench/setup_renewal.sql): a million
-- renewals without a million client round trips. Run with -M simple -D n=N.
call bench.renew_batch(:n);

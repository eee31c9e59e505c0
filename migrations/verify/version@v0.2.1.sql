-- Verify pgfence:version
-- version() exists and names a release: this entry or a later one (under `sqitch deploy
-- --log-only`, which adopts a one-file database at a newer release, it already says the newer).
select 1 / (pgfence.version() ~ '^[0-9]+\.[0-9]+\.[0-9]+$')::int;

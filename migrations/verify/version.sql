-- Verify pgfence:version
-- version() reads the release sealed last (NULL until the release's last change seals it; the
-- release change's verify checks the name).
select 'pgfence.version()'::regprocedure, pgfence.version();

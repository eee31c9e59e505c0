-- pgfence: a clean handover, acquire then release.
\set r random(1, 100)
select lease_id from pgfence.acquire('cycle-' || :client_id || '-' || :r, 'client-' || :client_id, interval '30 seconds') \gset
select pgfence.release(:lease_id);

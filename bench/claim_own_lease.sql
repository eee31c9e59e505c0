-- pgfence: claim 10 tasks, each client under a lease of its own (replicas serving one queue).
select * from pgfence.claim(md5('claim-' || :client_id)::uuid, 'bench', 10, interval '1 hour');

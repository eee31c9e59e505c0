-- pgfence: claim 10 tasks under the lease that all clients share (one owner, several claim loops).
select * from pgfence.claim(md5('bench-claim')::uuid, 'bench', 10, interval '1 hour');

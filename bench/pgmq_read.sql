-- pgfence: read 10 messages of a pgmq queue under the lease all clients share.
select * from pgfence_pgmq.read(md5('bench-pgmq')::uuid, 'bench', interval '1 hour', 10);

-- pgfence: acquire and release one resource (dead-r), whose history the property varies.
select lease_id from pgfence.acquire('dead-r', 'bench', interval '30 seconds') \gset
select pgfence.release(:lease_id);

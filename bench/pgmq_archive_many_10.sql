-- pgfence: archive 10 messages per call by the attempt ids their read minted (each transaction
-- the next 10 handles; once they run out it calls nothing, as pgmq_archive.sql then archives
-- nothing).
select count(*)
  from (select array(select h.attempt_id
                       from bench.handles h, (select nextval('bench.handles_seq') as k) b
                      where h.n > (b.k - 1) * 10 and h.n <= b.k * 10) as ids
        offset 0) x,
       pgfence_pgmq.archive_many(x.ids)
 where cardinality(x.ids) > 0;

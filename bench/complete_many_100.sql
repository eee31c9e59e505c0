-- pgfence: complete 100 tasks per call by the attempt ids their claim minted (each transaction
-- the next 100 handles), each with the result complete.sql gives its one. Once the handles run
-- out it calls nothing (and the driver prepares more), as complete.sql then completes nothing.
select count(*)
  from (select array(select h.attempt_id
                       from bench.handles h, (select nextval('bench.handles_seq') as k) b
                      where h.n > (b.k - 1) * 100 and h.n <= b.k * 100) as ids
        offset 0) x,
       pgfence.complete_many(x.ids, array_fill('{"ok": true}'::jsonb, array[cardinality(x.ids)]))
 where cardinality(x.ids) > 0;

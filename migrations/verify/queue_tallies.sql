-- Verify pgfence:queue_tallies
select queue, completed, failed from pgfence.queue_tallies where false;
select 'pgfence.fold_tallies()'::regprocedure;

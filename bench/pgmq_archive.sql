-- pgfence: archive a message by the attempt id its read minted (each transaction the next one).
select pgfence_pgmq.archive(h.attempt_id)
  from bench.handles h
 where h.n = (select nextval('bench.handles_seq'));

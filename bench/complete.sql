-- pgfence: complete a task by the attempt_id its claim minted (each transaction the next one).
select pgfence.complete(h.attempt_id, '{"ok": true}')
  from bench.handles h
 where h.n = (select nextval('bench.handles_seq'));

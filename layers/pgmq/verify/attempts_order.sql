-- Verify pgfence_pgmq:attempts_order
select read_order from pgfence_pgmq.attempts where false;
select 'pgfence_pgmq.attempts_message'::regclass, 'pgfence_pgmq.read_order'::regclass;

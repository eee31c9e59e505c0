-- Baseline of cycle_fenced.sql: the same 10 jobs through the queue a user would write by hand
-- (claim_bare.sql's claim): insert 10, claim 10, complete the 10 in one UPDATE.
begin;
insert into bench.queue (queue, payload)
select 'cycle', jsonb_build_object('job', 'resize', 'n', g) from generate_series(1, 10) g;
with c as (
  update bench.queue q
     set state = 'claimed', attempts = q.attempts + 1, visible_until = clock_timestamp() + interval '1 hour'
    from (select id
            from bench.queue
           where queue = 'cycle' and state = 'queued' and ready_at <= clock_timestamp()
           order by ready_at
           limit 10
             for update skip locked) c
   where q.id = c.id
  returning q.id)
select array_agg(c.id) as ids from c \gset
update bench.queue q
   set state = 'completed', result = '{"ok": true}', visible_until = null, finished_at = clock_timestamp()
 where q.id = any (:ids::bigint[]);
commit;

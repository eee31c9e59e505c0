-- Baseline of claim.sql, the whole package: the queue a user would write by hand.
update bench.queue q
   set state = 'claimed', attempts = q.attempts + 1, visible_until = clock_timestamp() + interval '1 hour'
  from (select id
          from bench.queue
         where queue = 'bench' and state = 'queued' and ready_at <= clock_timestamp()
         order by ready_at
         limit 10
           for update skip locked) c
 where q.id = c.id
returning q.id, q.attempts, q.payload;

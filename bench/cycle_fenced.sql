-- The whole cycle of 10 jobs in one transaction, through pgfence: enqueue 10, claim 10 under the
-- lease all clients share, complete the 10 in one call.
begin;
select count(pgfence.enqueue('cycle', jsonb_build_object('job', 'resize', 'n', g))) from generate_series(1, 10) g;
select array_agg(c.attempt_id) as ids from pgfence.claim(md5('bench-claim')::uuid, 'cycle', 10, interval '1 hour') c \gset
select count(*) from pgfence.complete_many(:ids::uuid[], array_fill('{"ok": true}'::jsonb, array[10]));
commit;

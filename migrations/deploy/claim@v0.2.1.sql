-- Deploy pgfence:claim
-- requires: lease_judgement
-- requires: attempt_leases
-- requires: tasks
-- requires: leases
-- requires: signing_key
-- requires: attempt_id
-- requires: checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.claim(lease_id uuid, queue text, qty int default 1, visibility interval default '30 seconds')
returns table (task_id bigint, attempt_id uuid, attempt int, payload jsonb)
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
-- The claim below has one good plan whatever the queue's size or qty (a primary-key lookup of
-- the picked ids); costed with qty unknown, plpgsql would plan it again on every call.
set plan_cache_mode = force_generic_plan
as $$
declare
  v_key bytea;
begin
  perform pgfence.check_not_null('lease_id', claim.lease_id);
  perform pgfence.check_name('queue', claim.queue);
  if claim.qty is null or claim.qty not between 1 and 1000 then
    perform pgfence.invalid_argument('qty', 'must be 1 to 1000', claim.qty::text);
  end if;
  perform pgfence.check_interval('visibility', claim.visibility);
  -- The ownership check of fence(), in the same transaction as the claim: the lease row stays
  -- locked until this transaction ends, so no successor can be granted between the check and
  -- the claim (I2 at the work boundary).
  perform pgfence.hold_current(claim.lease_id);
  select k.hmac_key into v_key from pgfence.signing_key k;
  -- SKIP LOCKED: claimers never wait for each other's rows. The ids are picked into an array
  -- so that the update finds its rows by primary key.
  return query
  update pgfence.tasks t
     set state = 'claimed',
         attempt = t.attempt + 1,
         lease_id = claim.lease_id,
         attempt_leases[t.attempt + 1] = claim.lease_id,  -- so a later stale result can be checked
         reported = false,
         visible_until = clock_timestamp() + claim.visibility
   where t.task_id = any (array(
           select p.task_id
             from pgfence.tasks p
            where p.queue = claim.queue and p.state = 'queued' and p.ready_at <= clock_timestamp()
            order by p.ready_at
            limit claim.qty
              for update skip locked))
  returning t.task_id, pgfence.attempt_uuid(t.task_id, t.attempt, claim.lease_id, v_key), t.attempt, t.payload;
end
$$;
comment on function pgfence.claim(uuid, text, int, interval) is
  'Claims up to qty ready tasks of queue under an active, unexpired lease, never waiting for rows other claimers hold; '
  'each claim mints an attempt_id. Raises PF001 when the lease is not current, 22023 on bad arguments.';

revoke all on function pgfence.claim(uuid, text, int, interval) from public;
grant execute on function pgfence.claim(uuid, text, int, interval) to pgfence_worker;

commit;

-- Revert pgfence:claim: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Refused while it would strand live state: a task claimed under 0.2.0 (the lease of its
-- attempt is in attempt_leases; one claimed under 0.1.0 has none there, and keeps working)
-- holds an attempt id signed with HMAC-SHA256, which release 0.1.0 cannot verify (its
-- complete, fail or extend would raise 22023). The share lock keeps claims out until this step commits; Sqitch
-- runs every step in a transaction of its own, so each step that would strand them checks.
lock table pgfence.tasks in share mode;
do $refuse$
declare
  v_claimed bigint;
  v_queues text;
begin
  select pg_catalog.count(*), pg_catalog.string_agg(distinct t.queue, ', ')
    into v_claimed, v_queues
    from pgfence.tasks t
   where t.state operator(pg_catalog.=) 'claimed'
     and t.attempt_leases[t.attempt] is not null;
  if v_claimed operator(pg_catalog.>) 0 then
    raise exception 'pgfence: revert of claim refused: % task(s) claimed under 0.2.0 (queues %) '
                    'would no longer be completed, failed or extended under release 0.1.0',
                    v_claimed, v_queues
      using errcode = '55000',
            hint = 'let them finish, or pause their resources (pgfence.prepare_update) until '
                   'update_status says drained, then revert again; sqitch deploy restores '
                   'what was reverted before this step';
  end if;
end
$refuse$;

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
  v_state text;
  v_expires_at timestamptz;
  v_key bytea;
begin
  perform pgfence.check_not_null('lease_id', claim.lease_id);
  perform pgfence.check_name('queue', claim.queue);
  if claim.qty is null or claim.qty not between 1 and 1000 then
    perform pgfence.invalid_argument('qty', 'must be 1 to 1000', claim.qty::text);
  end if;
  perform pgfence.check_interval('visibility', claim.visibility);
  -- The ownership check of fence(), in the same transaction as the claim: FOR KEY SHARE keeps
  -- the lease current until this transaction ends, so no successor can be granted between
  -- the check and the claim (I2 at the work boundary).
  select l.state, l.expires_at into v_state, v_expires_at
    from pgfence.leases l
   where l.lease_id = claim.lease_id
     for key share;
  if not found or v_state <> 'active' or v_expires_at <= clock_timestamp() then
    perform pgfence.lease_not_current(claim.lease_id);
  end if;
  select k.key into v_key from pgfence.signing_key k;
  -- SKIP LOCKED: claimers never wait for each other's rows. The ids are picked into an array
  -- so that the update finds its rows by primary key.
  return query
  update pgfence.tasks t
     set state = 'claimed',
         attempt = t.attempt + 1,
         lease_id = claim.lease_id,
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

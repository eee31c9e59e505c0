-- Benchmark fixtures, run once by scripts/bench in a fresh database that has sql/pgfence.sql
-- installed. Schema bench holds the baselines: the same work without fencing, on tables of the
-- same shape as pgfence's where the comparison is about fencing alone.
--
-- pgbench scripts cannot look up a lease_id once per client, and a lookup per transaction
-- would add the same cost to both sides of a pair and flatter the ratio. So the leases made
-- here get a lease_id derived from their resource name, md5(resource)::uuid, which a script
-- computes inline (a constant folded at plan time when the name is constant). They are
-- ordinary uuids in ordinary rows; nothing else about the leases is touched.

create schema bench;

-- Leases: 1,000 for renew, one shared by the claimers, one shared by the fenced writers, and
-- one per claimer for the claim variant with a lease per client.
select pgfence.register('renew-' || g) from generate_series(1, 1000) g;
select pgfence.register(r)
  from unnest(array['bench-claim', 'bench-fence', 'bench-pgmq', 'bench-pgflow', 'claim-0', 'claim-1', 'claim-2', 'claim-3',
                    'claim-4', 'claim-5', 'claim-6', 'claim-7']) r;
select pgfence.acquire(r.resource, 'bench', interval '1 day') from pgfence.resources r;
update pgfence.leases set lease_id = md5(resource)::uuid;

-- The resource and queue of the takeover-latency trials (leases made by the trials).
select pgfence.register('takeover');

-- Resources for the acquire/takeover cycle: 100 per client, so clients never wait for each
-- other and every acquire of a resource finds the previous lease expired.
select pgfence.register('cycle-' || c || '-' || g) from generate_series(0, 7) c, generate_series(1, 100) g;

-- renew baseline: a copy of the lease table (same columns, indexes, fillfactor) holding the
-- same 1,000 rows, updated by key with a raw UPDATE.
create table bench.leases_raw (like pgfence.leases including all) with (fillfactor = 70);
insert into bench.leases_raw select * from pgfence.leases where resource like 'renew-%';

-- complete baseline: a copy of the task table (same columns and indexes).
create table bench.tasks_raw (like pgfence.tasks including all);

-- What a client holds after a claim: the attempt_id (pgfence) or the task id (raw). Both sides
-- look theirs up the same way, by the next value of their own sequence.
create table bench.handles (n bigint primary key, attempt_id uuid not null);
create table bench.handles_raw (n bigint primary key, task_id bigint not null);
create sequence bench.handles_seq;
create sequence bench.handles_raw_seq;

-- The queue a user would write by hand: a primary key and one partial index on ready tasks.
create table bench.queue (
  id            bigint generated always as identity primary key,
  queue         text not null,
  payload       jsonb not null,
  state         text not null default 'queued',
  attempts      int not null default 0,
  ready_at      timestamptz not null default clock_timestamp(),
  visible_until timestamptz,
  result        jsonb,
  finished_at   timestamptz
);
create index queue_ready on bench.queue (queue, ready_at) where state = 'queued';

-- The claim without its ownership check: pgfence.claim's own definition with the lease
-- check (pgfence.hold_current: the FOR KEY SHARE lookup and its judgement) replaced by a plain
-- lookup of the lease's resource (claim records it), derived from the installed function so
-- that it stays the same claim when claim changes. It keeps the name claim (in schema bench)
-- because its body names its parameters claim.qty, claim.queue, ...
do $$
declare
  v_def text := pg_get_functiondef('pgfence.claim(uuid, text, int, interval)'::regprocedure);
  v_new text;
begin
  v_new := regexp_replace(v_def,
    '\n\s*select h\.resource into v_resource from pgfence\.hold_current\(claim\.lease_id\) h;',
    E'\n  select l.resource into v_resource from pgfence.leases l where l.lease_id = claim.lease_id;');
  if v_new = v_def then  -- release 0.2.1's claim (an --apply of it): no resource to record
    v_new := regexp_replace(v_def, '\n\s*perform pgfence\.hold_current\(claim\.lease_id\);', E'\n');
  end if;
  if v_new = v_def then
    raise exception 'bench: the ownership check of pgfence.claim was not found; update bench/setup.sql';
  end if;
  v_new := replace(v_new, 'FUNCTION pgfence.claim(', 'FUNCTION bench.claim(');
  execute v_new;
end
$$;

-- Fenced writes: a protected table and an unprotected one of the same shape.
create table bench.fenced_rows (
  id         bigint generated always as identity primary key,
  generation bigint not null,
  payload    jsonb not null,
  created_at timestamptz not null default clock_timestamp()
);
create table bench.plain_rows (like bench.fenced_rows including all);
select pgfence.protect('bench.fenced_rows', 'bench-fence');

vacuum analyze;

-- pgmq (the pgmq layer's pairs): queue bench read through pgfence_pgmq.read under the lease of
-- bench-pgmq, queue bench_raw of the same shape read by pgmq itself.
select pgmq.create('bench');
select pgmq.create('bench_raw');

-- pgflow (the pgflow layer's pair): two flows of one step each, bench_flow worked through
-- pgfence_pgflow under the lease of bench-pgflow, bench_flow_raw by pgflow's own protocol with
-- a worker row of its own, as pgflow's edge worker registers one.
select pgflow.create_flow('bench_flow');
select pgflow.add_step('bench_flow', 'only');
select pgflow.create_flow('bench_flow_raw');
select pgflow.add_step('bench_flow_raw', 'only');
insert into pgflow.workers (worker_id, queue_name, function_name)
values (md5('bench-pgflow-raw')::uuid, 'bench_flow_raw', 'bench-pgflow-raw');

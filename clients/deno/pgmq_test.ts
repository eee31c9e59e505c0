/**
 * The fenced pgmq consumer (`PgmqWorker`) on the real pgmq and pgfence's pgmq layer, directly
 * and through PgBouncer: each message handled once and archived (or deleted), a failure left
 * to be read again, a stale owner reads nothing, and no handler starts after its message's
 * visibility ran out (with its negative control). Run by tests/test_deno_pgmq.py, which makes
 * the database (pgmq, pgfence, the layer and the test helpers).
 *
 * @module
 */
import { Owner, PgmqWorker, type PgmqWorkerOptions, type Task } from "./mod.ts";
import {
  assert,
  assertEquals,
  FakeClock,
  gate,
  Recording,
  type Target,
  test,
} from "./test_support.ts";

/** A pgmq queue of this test's own (pgmq names: no hyphen), with `messages` messages. */
async function queue(t: Target, messages: number): Promise<string> {
  const q = t.name("q").replace("-", "_");
  await t.admin`select pgmq.create(${q})`;
  for (let n = 1; n <= messages; n++) {
    await t.admin`select pgmq.send(${q}, ${t.admin.json({ n })})`;
  }
  return q;
}

async function counts(t: Target, q: string): Promise<[number, number]> {
  const [row] = await t.admin.unsafe(
    `select (select count(*) from pgmq.q_${q})::int as queued,
            (select count(*) from pgmq.a_${q})::int as archived`,
  );
  return [row.queued as number, row.archived as number];
}

for (const finish of ["archive", "delete"] as const) {
  test(`each message is handled once, then ${finish}d`, async (t) => {
    const r = t.name("r");
    await t.admin`select pgfence.register(${r})`;
    const q = await queue(t, 3);
    const owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
    assert(await owner.acquire());
    const seen: string[] = [];
    const worker = new PgmqWorker({
      owner,
      queue: q,
      finish,
      qty: 2,
      handler: (p, { task }) => {
        seen.push(`${(p as { n: number }).n}/${task.attempt}`);
      },
    });
    await worker.run({ untilIdle: true });
    assertEquals(seen.sort(), ["1/1", "2/1", "3/1"]);
    assertEquals(worker.verdicts, { accepted: 3, duplicate: 0, stale: 0 });
    assertEquals(await counts(t, q), finish === "archive" ? [0, 3] : [0, 0]);
  });
}

test("a failed message is left hidden, then read again", async (t) => {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const q = await queue(t, 1);
  const handler = (_: unknown, { task }: { task: Task }) => {
    if (task.attempt === 1) throw new Error("not yet");
  };
  let owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
  assert(await owner.acquire());
  let worker = new PgmqWorker({ owner, queue: q, handler });
  await worker.run({ untilIdle: true });
  assertEquals([worker.failed, worker.verdicts.accepted], [1, 0]);
  assertEquals(
    await t.rows(t.admin.unsafe(`select read_ct, vt > now() as hidden from pgmq.q_${q}`)),
    [{ read_ct: 1, hidden: true }],
  );
  await t.admin.unsafe(`update pgmq.q_${q} set vt = now()`);
  owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
  assert(await owner.acquire());
  worker = new PgmqWorker({ owner, queue: q, handler });
  await worker.run({ untilIdle: true });
  assertEquals([worker.failed, worker.verdicts.accepted], [0, 1]);
  assertEquals(await counts(t, q), [0, 1]);
});

test("a stale owner reads nothing", async (t) => {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const q = await queue(t, 2);
  const old = new Owner({ sql: t.sql, resource: r, renewEvery: 3600, clock: new FakeClock().read });
  assert(await old.acquire());
  // Paused past its lease (its own clock has not moved: it still trusts the lease).
  await t.admin`select pgfence_test.expire(${old.leaseId}::uuid)`;
  const successor = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
  assert(await successor.acquire());
  const seen: unknown[] = [];
  const worker = new PgmqWorker({ owner: old, queue: q, handler: (p) => seen.push(p) });
  await worker.run({ untilIdle: true });
  assertEquals([seen.length, worker.handled], [0, 0]);
  assertEquals(
    await t.rows(t.admin.unsafe(`select max(read_ct)::int as reads from pgmq.q_${q}`)),
    [{ reads: 0 }],
  );
  await successor.release();
});

/** Broken on purpose: every message of a batch starts, whatever visibility is left. */
class StartsAnyway extends PgmqWorker {
  protected override stillHeld(): Promise<boolean> {
    return Promise.resolve(true);
  }
}

/** Two resources on one queue; A reads both messages (each handler 10 s: the read hides them
 * 20 s) and its first handler is slow, past its batch's hold: meanwhile the second message's
 * visibility runs out and B reads and handles it. */
async function slowBatchBesideAReplica(
  t: Target,
  cls: typeof PgmqWorker,
): Promise<[Record<string, number>, PgmqWorker]> {
  const [a, b] = [t.name("a"), t.name("b")];
  for (const r of [a, b]) await t.admin`select pgfence.register(${r})`;
  const q = await queue(t, 2);
  const clock = new FakeClock();
  const ownerA = new Owner({ sql: t.sql, resource: a, renewEvery: 3600, clock: clock.read });
  const ownerB = new Owner({ sql: t.sql, resource: b, renewEvery: 3600 });
  assert(await ownerA.acquire() && await ownerB.acquire());
  const runs: Record<string, number> = {};
  const slow = gate();
  const handler = async (payload: unknown) => {
    const n = (payload as { n: number }).n;
    runs[n] = (runs[n] ?? 0) + 1;
    if (n === 1) await slow.promise;
  };
  const workerA = new cls({ owner: ownerA, queue: q, handler, qty: 2, visibility: 10 });
  const workerB = new PgmqWorker({ owner: ownerB, queue: q, handler, visibility: 10 });
  const running = workerA.run({ maxTasks: 2, untilIdle: true });
  await t.waitUntil(() => Promise.resolve(runs[1] === 1), "A's first handler");
  clock.now += 21;
  await t.admin.unsafe(
    `update pgmq.q_${q} set vt = clock_timestamp() - interval '1 ms' where message->>'n' = '2'`,
  );
  await workerB.run({ maxTasks: 1 });
  slow.open();
  await running;
  return [runs, workerA];
}

test("no handler starts after its message's visibility ran out", async (t) => {
  const [runs, worker] = await slowBatchBesideAReplica(t, PgmqWorker);
  assertEquals(runs, { 1: 1, 2: 1 });
  assertEquals([worker.handled, worker.skipped, worker.verdicts.stale], [1, 1, 0]);
});

test("negative control: a pgmq worker that starts every message runs a handler twice", async (t) => {
  const [runs, worker] = await slowBatchBesideAReplica(t, StartsAnyway);
  assertEquals(runs, { 1: 1, 2: 2 });
  assertEquals([worker.handled, worker.verdicts.stale], [2, 1]);
});

// --- a batch: one read for its handlers' time, one statement for its messages ----------------

/** Broken on purpose, as the worker was: a read hides its batch for one handler's time. */
class HeldForOne extends PgmqWorker {
  override get hold(): number {
    return this.visibility;
  }
}

/** Broken on purpose, as the worker was: each message archived on its own. */
class OneByOne extends PgmqWorker {
  constructor(options: PgmqWorkerOptions) {
    super(options);
    // No statement for a batch's results: each is reported as its handler returns.
    Object.defineProperty(this, "reportManyStatement", { value: undefined });
  }
}

/** Three messages read as one batch (`qty` 3, each handler 10 s) by a worker whose handlers
 * each take `takes` seconds of the owner's clock; all archived once. The steps it sent. */
async function batchOfThree(
  t: Target,
  takes: number,
  cls: typeof PgmqWorker = PgmqWorker,
): Promise<string[]> {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const q = await queue(t, 3);
  const clock = new FakeClock();
  const owner = new Recording({
    sql: t.sql,
    resource: r,
    ttl: 600, // the batch's handlers take up to 30 s of the owner's clock
    renewEvery: 3600,
    clock: clock.read,
  });
  assert(await owner.acquire());
  owner.steps = [];
  const worker = new cls({
    owner,
    queue: q,
    qty: 3,
    visibility: 10,
    reportWithin: 50,
    handler: () => {
      clock.now += takes;
    },
  });
  await worker.run({ untilIdle: true });
  assertEquals([worker.verdicts.accepted, await counts(t, q)], [3, [0, 3]]);
  return owner.steps;
}

const AFTER = ["claim", "drain", "release"]; // the empty queue, then leaving
// The batch's results ride with the claim that finds the queue empty, then leaving.
const RIDING = ["claim", "complete_many", "drain", "release"];

test("a batch within its handlers' deadlines: one read, no set_vt, one archive_many", async (t) => {
  assertEquals(await batchOfThree(t, 9.5), ["claim", ...RIDING]);
});

test("negative control: a read held for one handler sets the rest's visibility", async (t) => {
  assertEquals(await batchOfThree(t, 9.5, HeldForOne), ["claim", "extend", "extend", ...RIDING]);
});

test("negative control: a worker that archives each message alone sends three", async (t) => {
  assertEquals(await batchOfThree(t, 0, OneByOne), [
    "claim",
    "complete",
    "complete",
    "complete",
    ...AFTER,
  ]);
});

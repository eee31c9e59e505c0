/**
 * The Deno client (mod.ts) against a real cluster, directly and through PgBouncer in
 * transaction pooling mode: the worker loop, the renew deadline, fenced writes, drain on
 * SIGTERM, release in a finally, the handler deadline, typed errors. Each guarantee has a
 * negative control: a deliberately broken variant of the client that the same test catches.
 * The Python client's tests (tests/test_client.py) are the model.
 */
import {
  connect,
  ConnectionLost,
  errorClasses,
  InvalidArgument,
  LeaseLost,
  LeaseNotCurrent,
  LockNotAvailable,
  Owner,
  type OwnerOptions,
  PgfenceError,
  pgfenceError,
  prepares,
  ResourceDisabled,
  ResourceUnknown,
  SerializationFailure,
  type Sql,
  type Step,
  type Task,
  UnfencedWrite,
  type Verdict,
  Worker,
  type WorkerOptions,
} from "./mod.ts";
import {
  assert,
  assertEquals,
  FakeClock,
  gate,
  Recording,
  rejects,
  type Target,
  test,
  testDirect,
} from "./test_support.ts";

test("the worker handles the queue and releases", async (t) => {
  const [r, q] = [t.name("w"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 0; n < 5; n++) {
    await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  }
  const owner = new Owner({ sql: t.sql, resource: r, ttl: 30 });
  assert(await owner.acquire());
  assert(typeof owner.generation === "bigint" && owner.generation > 0n);
  const worker = new Worker({
    owner,
    queue: q,
    handler: (p) => ({ double: (p as { n: number }).n * 2 }),
    qty: 2,
  });
  await worker.run({ maxTasks: 5 });
  assertEquals(
    await t.rows(
      t.admin`select state, result from pgfence.tasks where queue = ${q} order by task_id`,
    ),
    [0, 2, 4, 6, 8].map((d) => ({ state: "completed", result: { double: d } })),
  );
  assertEquals(worker.verdicts, { accepted: 5, duplicate: 0, stale: 0 });
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}`),
    [{ status: "released" }],
  );
  assert(!owner.valid);
});

test("the startup handshake: the invocation is acknowledged, a second owner waits", async (t) => {
  const r = t.name("w");
  await t.admin`select pgfence.register(${r})`;
  const [{ id }] = await t.admin`select pgfence.request_start(${r}) as id`;
  const first = new Owner({ sql: t.sql, resource: r, owner: "first" });
  const second = new Owner({ sql: t.sql, resource: r, owner: "second" });
  assert(await first.acquire(id as string));
  const generation = first.generation!;
  assert(!(await second.acquire()));
  assertEquals(await t.rows(t.admin`select pgfence.request_start(${r}) as id`), [{ id: null }]);
  await first.release();
  assert(await second.acquire());
  assert(second.generation! > generation, "a successor's generation is higher");
  await second.release();
});

test("pgfence's SQLSTATEs come back as typed errors", async (t) => {
  const [r, off] = [t.name("w"), t.name("off")];
  await t.admin`select pgfence.register(${off}, false)`;
  await rejects(
    new Owner({ sql: t.sql, resource: r }).acquire(),
    (e: unknown) => e instanceof ResourceUnknown && e.sqlstate === "PF002",
  );
  await rejects(
    new Owner({ sql: t.sql, resource: off }).acquire(),
    (e: unknown) => e instanceof ResourceDisabled && e.sqlstate === "PF003",
  );
  await rejects(
    new Owner({ sql: t.sql, resource: off, ttl: -1 }).acquire(),
    (e: unknown) => e instanceof InvalidArgument && e.message.includes("ttl"),
  );
  // The caller's own queries: the same mapping.
  const e = await t.sql`select pgfence.fence(${crypto.randomUUID()}::uuid)`.catch(pgfenceError);
  assert(e instanceof LeaseNotCurrent && e.sqlstate === "PF001", String(e));
  assert(!(pgfenceError(new Error("other")) instanceof LeaseNotCurrent));
});

testDirect("the Owner refuses a client that prepares statements", async () => {
  const sql = (await import("postgres")).default("postgres://nobody@127.0.0.1:1/none", {
    prepare: true,
  });
  try {
    let error: unknown;
    try {
      new Owner({ sql, resource: "r" });
    } catch (e) {
      error = e;
    }
    assert(error instanceof TypeError && error.message.includes("prepare: false"));
    assert(!connect("postgres://nobody@127.0.0.1:1/none", {}).options.prepare);
  } finally {
    await sql.end();
  }
});

// --- the renew deadline counts from the send ----------------------------------------------

/** The renewal's answer arrives `delay` seconds (on the fake clock) after it was sent. */
class SlowAnswer extends Owner {
  constructor(options: OwnerOptions, readonly fake: FakeClock, readonly delay: number) {
    super(options);
  }

  protected override async sendRenew(): Promise<string> {
    const state = await super.sendRenew();
    this.fake.now += this.delay;
    return state;
  }
}

/** Broken on purpose: the deadline counts from when the answer arrived. */
class NaiveOwner extends SlowAnswer {
  override async renewOnce(): Promise<string> {
    const state = await super.renewOnce();
    this.validUntil = this.clock() + this.ttl;
    return state;
  }
}

async function deadlineAfterSlowRenewal(
  t: Target,
  cls: typeof SlowAnswer,
): Promise<[number, boolean]> {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const clock = new FakeClock();
  const owner = new cls(
    { sql: t.sql, resource: r, ttl: 10, renewEvery: 3600, clock: clock.read },
    clock,
    8,
  );
  assert(await owner.acquire());
  clock.now = 105; // renewal sent at 105, answered at 113
  assertEquals(await owner.renewOnce(), "active");
  clock.now = 115.5; // after sent + ttl, before answered + ttl
  const valid = owner.valid;
  await owner.release();
  return [owner.deadline, valid];
}

testDirect("the renew deadline is measured from the send", async (t) => {
  assertEquals(await deadlineAfterSlowRenewal(t, SlowAnswer), [115, false]);
});

testDirect("negative control: a deadline from the answer stretches the lease", async (t) => {
  assertEquals(await deadlineAfterSlowRenewal(t, NaiveOwner), [123, true]);
});

// --- refused and stale owners -------------------------------------------------------------

test("a refused renewal stops claiming", async (t) => {
  const [r, q] = [t.name("r"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  await t.admin`select pgfence.enqueue(${q})`;
  const owner = new Owner({ sql: t.sql, resource: r, ttl: 30, renewEvery: 3600 });
  assert(await owner.acquire());
  await t.admin`select pgfence_test.expire(${owner.leaseId}::uuid)`; // the owner was paused ...
  await t.admin`select pgfence.acquire(${r}, 'successor', '30 s')`;
  await rejects(owner.renewOnce(), LeaseNotCurrent);
  assert(!owner.valid && owner.lost?.includes("refused"));
  assert(owner.signal.aborted && owner.signal.reason instanceof LeaseLost);
  const worker = new Worker({ owner, queue: q, handler: (p) => p });
  await worker.run();
  assertEquals(worker.handled, 0);
  assertEquals(
    await t.rows(t.admin`select state from pgfence.tasks where queue = ${q}`),
    [{ state: "queued" }],
  );
});

test("a fenced write after a takeover is refused with PF001", async (t) => {
  const [r, table] = [t.name("r"), t.name("ledger")];
  await t.admin`create table ${t.admin(table)} (note text, generation bigint)`;
  await t.admin`select pgfence.register(${r})`;
  await t.admin`select pgfence.protect(${table}::regclass, ${r})`;
  const owner = new Owner({ sql: t.sql, resource: r, ttl: 30, renewEvery: 3600 });
  assert(await owner.acquire());
  // Control: the current owner writes, in fenced() and in its own sql.begin (a pgflow worker's way).
  assertEquals(
    await owner.fenced(async (tx, generation) =>
      (await tx`insert into ${tx(table)} values ('mine', ${generation.toString()})`).count
    ),
    1,
  );
  await t.sql.begin(async (tx) => {
    const generation = await owner.fence(tx);
    await tx`insert into ${tx(table)} values ('also mine', ${generation.toString()})`;
  });
  // A write without fence is refused by the guard.
  const unfenced = await t.sql`insert into ${t.sql(table)} values ('unfenced', null)`.catch(
    pgfenceError,
  );
  assert(unfenced instanceof UnfencedWrite && unfenced.sqlstate === "PF007", String(unfenced));
  await t.admin`select pgfence_test.expire(${owner.leaseId}::uuid)`;
  await t.admin`select pgfence.acquire(${r}, 'successor', '30 s')`;
  assert(owner.valid); // the owner does not know yet
  const refused = await owner.fenced((tx) => tx`insert into ${tx(table)} values ('stale', 1)`)
    .catch((e) => e);
  assert(refused instanceof LeaseLost && refused.cause instanceof LeaseNotCurrent, String(refused));
  assert(!owner.valid);
  // Refused locally now, before any round trip.
  await rejects(t.sql.begin((tx) => owner.fence(tx)), LeaseLost);
  assertEquals(
    await t.rows(t.admin`select note, generation from ${t.admin(table)} order by note`),
    [{ note: "also mine", generation: `${owner.generation}` }, {
      note: "mine",
      generation: `${owner.generation}`,
    }],
  );
  await owner.release();
});

testDirect("past its local deadline an owner fences nothing, without asking", async (t) => {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const clock = new FakeClock();
  const owner = new Owner({
    sql: t.sql,
    resource: r,
    ttl: 10,
    renewEvery: 3600,
    clock: clock.read,
  });
  assert(await owner.acquire());
  assertEquals(await owner.fenced(() => Promise.resolve("ok")), "ok");
  clock.now = 110; // sent at 100 + ttl: the database may already have a successor
  assert(!owner.valid);
  await rejects(owner.fenced(() => Promise.resolve("no")), /expired locally/);
  await rejects(t.sql.begin((tx) => owner.fence(tx)), /expired locally/); // in a caller's transaction
  // The database still holds it: the client stopped trusting it first, as it must.
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}`),
    [{ status: "current" }],
  );
  await owner.release();
});

// --- leaving: drain on SIGTERM, release in a finally --------------------------------------

test("SIGTERM drains: the task in hand is finished, nothing more claimed, released", async (t) => {
  const [r, q] = [t.name("w"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 0; n < 3; n++) await t.admin`select pgfence.enqueue(${q})`;
  const owner = new Owner({ sql: t.sql, resource: r, ttl: 30, renewEvery: 3600 });
  assert(await owner.acquire());
  const seen = gate();
  const worker = new Worker({
    owner,
    queue: q,
    handler: async () => {
      Deno.kill(Deno.pid, "SIGTERM");
      await seen.promise; // the worker's listener, added first, has run by now
      return { done: true };
    },
  });
  const remove = worker.installShutdown();
  const mark = () => seen.open();
  Deno.addSignalListener("SIGTERM", mark);
  try {
    await worker.run();
  } finally {
    remove();
    Deno.removeSignalListener("SIGTERM", mark);
  }
  assertEquals(
    await t.rows(t.admin`select state, count(*)::int as n from pgfence.tasks where queue = ${q}
                          group by state order by state`),
    [{ state: "completed", n: 1 }, { state: "queued", n: 2 }],
  );
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}`),
    [{ status: "released" }],
  );
});

class BrokenDrain extends Owner {
  override drain(): Promise<void> {
    return Promise.reject(new Error("drain is broken"));
  }
}

/** Broken on purpose: a failing drain skips the release. */
class DrainThenRelease extends Worker {
  protected override async leave(): Promise<void> {
    await this.owner.drain();
    await this.owner.release();
  }
}

async function workerWhoseDrainFails(t: Target, cls: typeof Worker): Promise<Owner> {
  const r = t.name("w");
  await t.admin`select pgfence.register(${r})`;
  const owner = new BrokenDrain({ sql: t.sql, resource: r, ttl: 30, renewEvery: 0.01 });
  assert(await owner.acquire());
  await rejects(
    new cls({ owner, queue: t.name("q"), handler: (p) => p }).run({ maxTasks: 0 }),
    /drain is broken/,
  );
  return owner;
}

async function renewedAgain(t: Target, r: string): Promise<boolean> {
  const [{ since }] = await t.admin`select clock_timestamp() as since`;
  await t.waitUntil(async () => {
    const [{ renewed }] = await t.admin`select coalesce(renewed_at > ${since as Date}, false)
                                               or status <> 'current' as renewed
                                          from pgfence.lease_status where resource = ${r}`;
    return renewed as boolean;
  }, "a renewal or the lease's end");
  const [{ status }] = await t.admin`select status from pgfence.lease_status where resource = ${r}`;
  return status === "current";
}

test("the worker releases even when drain fails", async (t) => {
  const owner = await workerWhoseDrainFails(t, Worker);
  assertEquals(
    await t.rows(
      t.admin`select status from pgfence.lease_status where resource = ${owner.resource}`,
    ),
    [{ status: "released" }],
  );
  assert(!owner.valid && owner.lost === "released");
});

test("negative control: a failing drain that skips the release leaves the lease renewed", async (t) => {
  const owner = await workerWhoseDrainFails(t, DrainThenRelease);
  assert(await renewedAgain(t, owner.resource), "the renewer still renews the lease");
  assert(owner.valid);
  await owner.release();
});

// --- a hung handler gives its lease up ----------------------------------------------------

interface Hung {
  owner: Owner;
  worker: Worker;
  task: Task;
  signal: AbortSignal;
  finish(): Promise<void>;
}

/**
 * A worker whose handler waits on a gate the test opens; the owner's clock then moves past the
 * handler's deadline (by default the task's visibility, 10 s), the lease's ttl (30 s) still
 * ahead. Renewals run every 20 ms of real time.
 */
async function hungPastItsDeadline(t: Target, r: string, handlerTimeout?: number): Promise<Hung> {
  const q = t.name("q");
  await t.admin`select pgfence.register(${r})`;
  await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n: 1 })})`;
  const clock = new FakeClock();
  const owner = new Owner({
    sql: t.sql,
    resource: r,
    owner: "hung",
    ttl: 30,
    renewEvery: 0.02,
    clock: clock.read,
  });
  assert(await owner.acquire());
  const started = gate<[Task, AbortSignal]>();
  const unblock = gate();
  const worker = new Worker({
    owner,
    queue: q,
    visibility: 10,
    handlerTimeout,
    handler: async (payload, context) => {
      started.open([context.task, context.signal]);
      await unblock.promise;
      return { ...(payload as object), late: true };
    },
  });
  const running = worker.run({ maxTasks: 1 });
  const [task, signal] = await started.promise;
  clock.now += 11;
  return {
    owner,
    worker,
    task,
    signal,
    finish: async () => {
      unblock.open();
      await running;
    },
  };
}

/** Generation 1's status once it has been either renewed after the deadline passed or taken
 * out of `current`. Two rounds: one renewal decided before the clock moved may still land
 * after it; a second one can only have been decided after. */
async function leaseAfterTheDeadline(t: Target, r: string): Promise<string> {
  await renewedAgain(t, r);
  return (await renewedAgain(t, r)) ? "current" : "draining";
}

for (const reclaimed of [true, false]) {
  const verdict = reclaimed ? "stale" : "accepted";
  test(`a hung handler past its deadline gives the lease up (re-claimed: ${verdict})`, async (t) => {
    const r = t.name("w");
    const hung = await hungPastItsDeadline(t, r);
    assertEquals(await leaseAfterTheDeadline(t, r), "draining");
    assert(!hung.owner.valid && hung.owner.lost?.includes("deadline"));
    assert(hung.signal.aborted, "the handler's signal aborted at the deadline");
    // A successor is admitted at once, not after the ttl.
    const [successor] = await t.admin`select * from pgfence.acquire(${r}, 'successor', '30 s')`;
    assert(BigInt(successor.generation as string) > hung.owner.generation!);
    if (reclaimed) {
      await t.admin`select pgfence_test.expire_attempt(${hung.task.attemptId}::uuid)`;
      await t.admin`select pgfence.requeue_expired()`;
      const lease = successor.lease_id as string;
      const q = hung.worker.queue;
      const claimed = await t.admin`select * from pgfence.claim(${lease}::uuid, ${q}, 1, '30 s')`;
      assertEquals(claimed.length, 1);
    }
    await hung.finish();
    // The late result is judged by I5: stale once re-claimed, accepted otherwise.
    assertEquals(hung.worker.verdicts[verdict], 1);
    assertEquals(hung.worker.handled, 1);
    assertEquals(
      await t.rows(
        t.admin`select rank() over (order by generation)::int as generation, owner, status, coalesce(renewed_at, acquired_at)
                                   <= drained_at as quiet_after_drain
                              from pgfence.lease_status where resource = ${r} order by 1`,
      ),
      [
        { generation: 1, owner: "hung", status: "released", quiet_after_drain: true },
        { generation: 2, owner: "successor", status: "current", quiet_after_drain: null },
      ],
    );
    const q = hung.worker.queue;
    if (reclaimed) {
      assertEquals(
        await t.rows(t.admin`select state, attempt from pgfence.tasks where queue = ${q}`),
        [{ state: "claimed", attempt: 2 }],
      );
      assertEquals(
        await t.rows(t.admin`select kind, body from pgfence.stale_results
                              where attempt_id = ${hung.task.attemptId}::uuid`),
        [{ kind: "complete", body: { n: 1, late: true } }],
      );
    } else {
      assertEquals(
        await t.rows(t.admin`select state, result from pgfence.tasks where queue = ${q}`),
        [{ state: "completed", result: { n: 1, late: true } }],
      );
    }
  });
}

test("negative control: without a deadline a hung handler keeps the lease", async (t) => {
  const r = t.name("w");
  const hung = await hungPastItsDeadline(t, r, Infinity);
  assertEquals(await leaseAfterTheDeadline(t, r), "current");
  assert(hung.owner.valid && !hung.signal.aborted);
  assertEquals(
    await t.rows(t.admin`select lease_id from pgfence.acquire(${r}, 'successor', '30 s')`),
    [{ lease_id: null }],
  );
  await hung.finish();
  assertEquals(hung.worker.verdicts.accepted, 1);
  assertEquals(
    await t.rows(
      t.admin`select count(*)::int as leases, min(status) as status from pgfence.lease_status where resource = ${r}`,
    ),
    [{ leases: 1, status: "released" }],
  );
});

// --- failures and extend -------------------------------------------------------------------

test("a throwing handler fails its task; extend keeps it until another attempt holds it", async (t) => {
  const [r, other, q] = [t.name("w"), t.name("other"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  await t.admin`select pgfence.register(${other})`;
  await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n: 1 })})`;
  const owner = new Owner({ sql: t.sql, resource: r, ttl: 30, renewEvery: 3600 });
  assert(await owner.acquire());
  const extended: (Date | null)[] = [];
  const worker = new Worker({
    owner,
    queue: q,
    handler: async (_payload, context) => {
      extended.push(await context.extend(60));
      // Its visibility runs out, and a replica's attempt takes the task over.
      await t.admin`select pgfence_test.expire_attempt(${context.task.attemptId}::uuid)`;
      await t.admin`select pgfence.requeue_expired()`;
      const [lease] = await t.admin`select * from pgfence.acquire(${other}, 'replica', '30 s')`;
      await t.admin`select * from pgfence.claim(${lease
        .lease_id as string}::uuid, ${q}, 1, '30 s')`;
      extended.push(await context.extend(60));
      throw new Error("the handler gave up");
    },
  });
  await worker.run({ maxTasks: 1 });
  assert(extended[0] instanceof Date && extended[1] === null, String(extended));
  assertEquals(worker.verdicts, { accepted: 0, duplicate: 0, stale: 1 });
  assertEquals(
    await t.rows(
      t.admin`select kind, body from pgfence.stale_results s join pgfence.tasks using (task_id)
                          where queue = ${q}`,
    ),
    [{ kind: "fail", body: { error: "the handler gave up" } }],
  );
});

// --- connect() ----------------------------------------------------------------------------

testDirect("connect() refuses an empty or missing URL instead of localhost:5432", async () => {
  for (const url of ["", "  ", undefined, null]) {
    let error: unknown;
    try {
      connect(url as string);
    } catch (e) {
      error = e;
    }
    assert(error instanceof TypeError && error.message.includes("needs a database URL"), `${url}`);
  }
  // Negative control: what connect() stands between: postgres.js takes "" for localhost:5432.
  const sql = (await import("postgres")).default("", { prepare: false });
  try {
    assertEquals([sql.options.host, sql.options.port], [["localhost"], [5432]]);
  } finally {
    await sql.end();
  }
});

// --- the error map --------------------------------------------------------------------------

/** The SQLSTATEs docs/errors.md names (backquoted five-character codes with a digit). */
function documentedCodes(text: string): string[] {
  const codes = [...text.matchAll(/`([0-9A-Z]{5})`/g)].map((m) => m[1]).filter((c) => /\d/.test(c));
  return [...new Set(codes)].sort();
}

/** The documented codes the client has no typed error for. */
function unmapped(text: string): string[] {
  return documentedCodes(text).filter((code) => !(code in errorClasses));
}

const ERRORS_MD = new URL("../../docs/errors.md", import.meta.url);

testDirect("every SQLSTATE of docs/errors.md comes back as its own typed error", async (t) => {
  const doc = await Deno.readTextFile(ERRORS_MD);
  const codes = documentedCodes(doc);
  assert(codes.includes("PF001") && codes.includes("55P03") && codes.length >= 12, `${codes}`);
  assertEquals(unmapped(doc), []);
  const classes = new Set<unknown>();
  for (const code of codes) {
    // Raised by the server, as pgfence raises it, and mapped as the client maps it.
    const e = pgfenceError(
      await t.admin.unsafe(
        `do $$ begin raise exception 'pgfence: lease ${crypto.randomUUID()} test' using errcode = '${code}', hint = 'h'; end $$`,
      ).catch((e) => e),
    );
    assert(e instanceof errorClasses[code] && e.sqlstate === code && e.hint === "h", `${code}`);
    assert(e.constructor !== PgfenceError && !(e.message.match(/[0-9a-f]{8}-/)), e.message);
    classes.add(e.constructor);
  }
  assertEquals(classes.size, codes.length); // one class per code
  // Negative controls: a code added to docs/errors.md without a class is caught, and a code the
  // map lacks comes back untyped.
  assertEquals(unmapped(doc + "\n| `PF042` | a new condition | | |\n"), ["PF042"]);
  const other = await t.admin.unsafe(
    "do $$ begin raise exception 'x' using errcode = 'PF042'; end $$",
  ).catch(pgfenceError);
  assert(!(other instanceof PgfenceError), String(other));
});

test("no lease id in an error's message, nor in why the lease was lost", async (t) => {
  const r = t.name("r");
  await t.admin`select pgfence.register(${r})`;
  const owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
  assert(await owner.acquire());
  const lease = owner.leaseId!;
  await t.admin`select pgfence_test.expire(${lease}::uuid)`;
  // The database's own message names the lease by resource and generation, never its id
  // (0.2.0; its negative control is tests/test_capabilities_in_errors.py); the client's
  // redaction stays for older servers.
  const raw = await t.sql`select pgfence.renew(${lease}::uuid, '30 s')`.catch((e) => e);
  assert(
    !String(raw.message).includes(lease) &&
      String(raw.message).includes(`lease of ${r} generation`),
    raw.message,
  );
  const refused = await rejects(owner.renewOnce(), LeaseNotCurrent) as LeaseNotCurrent;
  for (const text of [refused.message, refused.detail ?? "", owner.lost ?? "", String(refused)]) {
    assert(!text.includes(lease), text);
  }
  assert(owner.lost!.includes(`${r} generation ${owner.generation}`), owner.lost!);
  const lost = await rejects(owner.fenced(() => Promise.resolve()), LeaseLost);
  assert(!String(lost).includes(lease) && String(lost).includes(r), String(lost));
  await owner.release();
});

// --- the backoff: capped, full jitter ------------------------------------------------------

/** Shows the protected backoff. */
class ShowsBackoff extends Owner {
  wait(failures: number): number {
    return this.backoff(failures);
  }
}

testDirect("retries wait with capped exponential backoff and full jitter", (t) => {
  let draw = 0.5;
  const owner = new ShowsBackoff({
    sql: t.sql,
    resource: "r",
    retry: { base: 0.1, cap: 10, random: () => draw },
  });
  // Half of min(cap, base * 2^n): 0.05, 0.1, 0.2, ... until the cap (10) halves to 5.
  assertEquals([0, 1, 2, 6, 7, 20].map((n) => owner.wait(n)), [0.05, 0.1, 0.2, 3.2, 5, 5]);
  draw = 0.999;
  assert(owner.wait(30) < 10 && owner.wait(30) > 9.9, "the cap bounds every wait");
  draw = 0; // full jitter reaches down to the floor: a millisecond
  assertEquals(owner.wait(5), 0.001);
  // The defaults (the Python client's Retry): 0.1 s, 10 s, 60 s; 5 tries of a conflict.
  const defaults = new Owner({ sql: t.sql, resource: "r" }).retry;
  assertEquals([defaults.base, defaults.cap, defaults.giveUp, defaults.conflicts], [
    0.1,
    10,
    60,
    5,
  ]);
  assert(defaults.random === Math.random);
  return Promise.resolve();
});

// --- 40001 and 40P01 are retried ------------------------------------------------------------

/** Counts the waits before retries. */
class CountingOwner extends Owner {
  retries = 0;
  protected override backoff(failures: number): number {
    this.retries += 1;
    return super.backoff(failures);
  }
}

/**
 * A fenced transaction under REPEATABLE READ whose fence meets a lease row that another
 * transaction changed after its snapshot (docs/errors.md: 40001). The other transaction holds
 * the row (FOR UPDATE, which the fence's FOR KEY SHARE waits for) until the fence waits for it,
 * then commits its change. Returns the fenced call's outcome, the owner and the rows written.
 */
async function fencedMeetsAConcurrentChange(
  t: Target,
  conflicts?: number,
): Promise<[unknown, CountingOwner, number]> {
  const [r, table, app] = [t.name("r"), t.name("t"), t.name("rr")];
  await t.admin`create table ${t.admin(table)} (note text)`;
  await t.admin`select pgfence.register(${r})`;
  const sql = connect(Deno.env.get("PGFENCE_DENO_DIRECT_URL")!, {
    connection: { application_name: app, default_transaction_isolation: "repeatable read" },
    onnotice: () => {},
  });
  const owner = new CountingOwner({
    sql,
    resource: r,
    renewEvery: 3600,
    retry: { random: () => 0, conflicts },
  });
  const holder = await t.admin.reserve();
  try {
    assert(await owner.acquire());
    await holder`begin`;
    await holder`select from pgfence.leases where lease_id = ${owner.leaseId}::uuid for update`;
    await holder`update pgfence.leases set expires_at = expires_at
                  where lease_id = ${owner.leaseId}::uuid`;
    let runs = 0;
    const fenced = owner.fenced(async (tx) => {
      runs += 1;
      await tx`insert into ${tx(table)} values ('once')`;
      return runs;
    }).then((v) => v, (e) => e);
    await t.waitUntil(async () => {
      const [{ waiting }] = await t.admin`select count(*)::int as waiting from pg_stat_activity
                                           where application_name = ${app}
                                             and wait_event_type = 'Lock'`;
      return waiting === 1;
    }, "the fence to wait for the lease row");
    await holder`commit`;
    const outcome = await fenced;
    const [{ n }] = await t.admin`select count(*)::int as n from ${t.admin(table)}`;
    return [outcome, owner, n as number];
  } finally {
    await holder`rollback`; // a no-op after the commit
    holder.release();
    await owner.release();
    await sql.end({ timeout: 1 });
  }
}

testDirect("a fenced transaction refused with 40001 is run again", async (t) => {
  const [outcome, owner, rows] = await fencedMeetsAConcurrentChange(t);
  assertEquals([outcome, owner.retries, rows], [1, 1, 1]); // fn ran once: the first try failed at fence
});

testDirect("negative control: without conflict retries the 40001 reaches the caller", async (t) => {
  const [outcome, owner, rows] = await fencedMeetsAConcurrentChange(t, 1);
  assert(outcome instanceof SerializationFailure && outcome.retryable, String(outcome));
  assertEquals([owner.retries, rows], [0, 0]);
});

// --- 55P03 is retried: a lock wait that pgfence bounds gave up -----------------------------

/**
 * A statement of the client that waits for a row another session holds, on a connection whose
 * lock_timeout is short (as pgfence bounds a layer's result's wait: 55P03). With `retry` the
 * holder lets go once the client has tried again; the statement's outcome and the owner.
 */
async function waitsForAHeldRow(t: Target, conflicts?: number): Promise<[unknown, CountingOwner]> {
  const [r, table, app] = [t.name("r"), t.name("t"), t.name("lw")];
  await t.admin`create table ${t.admin(table)} (note text)`;
  await t.admin`insert into ${t.admin(table)} values ('row')`;
  await t.admin`select pgfence.register(${r})`;
  const sql = connect(Deno.env.get("PGFENCE_DENO_DIRECT_URL")!, {
    connection: { application_name: app, lock_timeout: 50 },
    onnotice: () => {},
  });
  const owner = new CountingOwner({
    sql,
    resource: r,
    renewEvery: 3600,
    retry: { random: () => 0, conflicts },
  });
  const holder = await t.admin.reserve();
  try {
    await holder`begin`;
    await holder`select from ${holder(table)} for update`;
    const locked = owner.query("complete", (s) => s`select note from ${s(table)} for update`)
      .then((v) => v, (e) => e);
    if (conflicts === undefined) {
      await t.waitUntil(() => Promise.resolve(owner.retries > 0), "a retry");
    } else await locked;
    await holder`commit`;
    return [await locked, owner];
  } finally {
    await holder`rollback`; // a no-op after the commit
    holder.release();
    await sql.end({ timeout: 1 });
  }
}

testDirect("a statement refused with 55P03 is sent again", async (t) => {
  const [outcome, owner] = await waitsForAHeldRow(t);
  assertEquals(outcome, [{ note: "row" }]);
  assert(owner.retries >= 1, `${owner.retries}`);
});

testDirect("negative control: without conflict retries the 55P03 reaches the caller", async (t) => {
  const [outcome, owner] = await waitsForAHeldRow(t, 1);
  assert(outcome instanceof LockNotAvailable && outcome.retryable, String(outcome));
  assertEquals(owner.retries, 0);
});

// --- no handler starts after its visibility ran out -----------------------------------------

/** Broken on purpose, today's behaviour: every task of a batch starts, whatever time is left. */
class StartsAnyway extends Worker {
  protected override stillHeld(): Promise<boolean> {
    return Promise.resolve(true);
  }
}

/**
 * Two resources serve one queue. Worker A claims both tasks (a batch of two, each handler 10 s:
 * the claim holds them 20 s); its first handler is slow: while it runs, A's clock passes the
 * batch's hold, the second task's visibility runs out in the database, and replica B re-claims
 * that task and handles it. Then A's first handler returns. Returns how often each task's
 * handler ran, and worker A.
 */
async function slowBatchBesideAReplica(
  t: Target,
  cls: typeof Worker,
): Promise<[Record<string, number>, Worker]> {
  const [a, b, q] = [t.name("a"), t.name("b"), t.name("q")];
  for (const r of [a, b]) await t.admin`select pgfence.register(${r})`;
  for (const n of [1, 2]) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const clock = new FakeClock();
  const ownerA = new Owner({ sql: t.sql, resource: a, renewEvery: 3600, clock: clock.read });
  const ownerB = new Owner({ sql: t.sql, resource: b, renewEvery: 3600 });
  assert(await ownerA.acquire() && await ownerB.acquire());
  const runs: Record<string, number> = {};
  const slow = gate();
  const replicaDone = gate();
  const handler = async (payload: unknown, { task }: { task: Task }) => {
    const n = (payload as { n: number }).n;
    runs[n] = (runs[n] ?? 0) + 1;
    if (n === 1) await slow.promise;
    return { n, attempt: task.attempt };
  };
  const workerA = new cls({ owner: ownerA, queue: q, handler, qty: 2, visibility: 10 });
  const workerB = new Worker({ owner: ownerB, queue: q, handler, visibility: 10 });
  const running = workerA.run({ maxTasks: 2, untilIdle: true });
  await t.waitUntil(() => Promise.resolve(runs[1] === 1), "A's first handler");
  clock.now += 21; // A's first handler has run longer than its batch's hold
  await t.admin`update pgfence.tasks set visible_until = clock_timestamp() - interval '1 ms'
                 where queue = ${q} and payload->>'n' = '2'`;
  await workerB.run({ maxTasks: 1 }).then(() => replicaDone.open());
  await replicaDone.promise;
  slow.open();
  await running;
  return [runs, workerA];
}

test("no handler starts after its task's visibility ran out: every handler runs once", async (t) => {
  const [runs, worker] = await slowBatchBesideAReplica(t, Worker);
  assertEquals(runs, { 1: 1, 2: 1 });
  assertEquals([worker.handled, worker.skipped, worker.verdicts.stale], [1, 1, 0]);
});

test("negative control: starting every task of the batch runs a handler twice", async (t) => {
  const [runs, worker] = await slowBatchBesideAReplica(t, StartsAnyway);
  assertEquals(runs, { 1: 1, 2: 2 });
  assertEquals([worker.handled, worker.verdicts.stale], [2, 1]);
});

/** Records the extends it sends. */
class CountingExtends extends Worker {
  extended: number[] = [];
  protected override extend(attemptId: string, visibility: number): Promise<Date | null> {
    this.extended.push(visibility);
    return super.extend(attemptId, visibility);
  }
}

test("a later task of a batch whose handlers ran long is extended first", async (t) => {
  const [r, q] = [t.name("r"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (const n of [1, 2, 3]) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const clock = new FakeClock();
  const owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600, clock: clock.read });
  assert(await owner.acquire());
  const worker = new CountingExtends({
    owner,
    queue: q,
    qty: 3,
    visibility: 10,
    handlerTimeout: Infinity, // no deadline: each handler needs `visibility` left at its start
    handler: (payload) => {
      clock.now += 12; // each handler takes 12 s of the batch's 30
      return payload;
    },
  });
  await worker.run({ maxTasks: 3 });
  // Task 1: 30 s left; task 2: 18 s, enough for 10; task 3: 6 s, extended by 10 first.
  assertEquals([worker.extended, worker.handled, worker.verdicts.accepted], [[10], 3, 3]);
});

// --- a batch: one claim for its handlers' time, one statement for its results -----------------

/** Broken on purpose, as the client was: a claim holds its batch for one handler's time. */
class HeldForOne extends Worker {
  override get hold(): number {
    return this.visibility;
  }
}

/** Broken on purpose, as the client was: each result reported on its own, as its handler returns. */
class OneByOne extends Worker {
  constructor(options: WorkerOptions) {
    super(options);
    // No statement for a batch's results: each is reported as its handler returns.
    Object.defineProperty(this, "reportManyStatement", { value: undefined });
  }
}

/**
 * Five tasks claimed as one batch (`qty` 5, each handler 10 s) by a worker whose handlers each
 * take `takes` seconds of the owner's clock; odd tasks return `{ n }`, even ones nothing. Checks
 * that every task completed once with its own result; returns the steps the worker sent and
 * the time each handler had left at its start.
 */
async function batchOfFive(
  t: Target,
  takes: number,
  options: { cls?: typeof Worker; reportWithin?: number } = {},
): Promise<[Step[], number[]]> {
  const [r, q] = [t.name("r"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 1; n <= 5; n++) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const clock = new FakeClock();
  const owner = new Recording({
    sql: t.sql,
    resource: r,
    ttl: 600, // the batch's handlers take up to 50 s of the owner's clock
    renewEvery: 3600,
    clock: clock.read,
  });
  assert(await owner.acquire());
  owner.steps = [];
  const left: number[] = [];
  const worker = new (options.cls ?? Worker)({
    owner,
    queue: q,
    qty: 5,
    visibility: 10,
    reportWithin: options.reportWithin,
    handler: (payload, { deadline }) => {
      left.push(deadline - clock.now);
      clock.now += takes;
      const n = (payload as { n: number }).n;
      return n % 2 === 1 ? { n } : undefined;
    },
  });
  await worker.run({ untilIdle: true });
  assertEquals(worker.verdicts, { accepted: 5, duplicate: 0, stale: 0 });
  assertEquals(
    await t.rows(t.admin`select state, result from pgfence.tasks where queue = ${q}
                           order by task_id`),
    [1, 2, 3, 4, 5].map((n) => ({ state: "completed", result: n % 2 === 1 ? { n } : null })),
  );
  return [owner.steps, left];
}

const AFTER = ["claim", "requeue", "drain", "release"]; // the empty queue, then leaving
// The last results ride with the claim that finds the queue empty (its steps: the claim, then
// the results' statement), then leaving.
const RIDING = (results: Step) => ["claim", results, "requeue", "drain", "release"];

test("a batch of handlers within their deadlines: one claim, no extend, one complete_many", async (t) => {
  const [steps, left] = await batchOfFive(t, 9.5, { reportWithin: 50 });
  assertEquals(steps, ["claim", ...RIDING("complete_many")]);
  assertEquals(left, [10, 10, 10, 10, 10]); // each handler had its whole deadline
});

test("negative control: a claim held for one handler extends the rest of its batch", async (t) => {
  const [steps] = await batchOfFive(t, 9.5, { cls: HeldForOne, reportWithin: 50 });
  assertEquals(steps, [
    "claim",
    "extend",
    "extend",
    "extend",
    "extend",
    ...RIDING("complete_many"),
  ]);
});

test("quick handlers: the batch's five results in one statement", async (t) => {
  const [steps] = await batchOfFive(t, 0);
  assertEquals(steps, ["claim", ...RIDING("complete_many")]);
});

test("negative control: a worker that reports each result alone sends five", async (t) => {
  const [steps] = await batchOfFive(t, 0, { cls: OneByOne });
  assertEquals(steps, [
    "claim",
    "complete",
    "complete",
    "complete",
    "complete",
    "complete",
    ...AFTER,
  ]);
});

test("a result waits no longer than reportWithin: slow handlers' go one by one", async (t) => {
  const [steps] = await batchOfFive(t, 2, { reportWithin: 1 });
  assertEquals(steps, [
    "claim",
    "complete",
    "complete",
    "complete",
    "complete",
    ...RIDING("complete"),
  ]);
});

// --- prepared statements --------------------------------------------------------------------

/** pgfence's statements the server holds prepared for the session of a one-connection pool. */
async function preparedIn(sql: Sql): Promise<string[]> {
  const rows = await sql`select statement from pg_prepared_statements
                          where statement like '%pgfence.%' order by statement`;
  return rows.map((r) => r.statement as string);
}

test("prepared statements on a direct connection, none through PgBouncer", async (t) => {
  const [r, q] = [t.name("r"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 0; n < 4; n++) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const sql = connect(t.url, { max: 1, onnotice: () => {} }); // detected (the default)
  try {
    const owner = new Owner({ sql, resource: r, renewEvery: 3600 });
    assert(await owner.acquire());
    const seen: string[][] = [];
    // Between the worker's statements, on its one connection: the second batch's handlers see
    // what the first batch's claim and complete_many left prepared.
    const worker = new Worker({
      owner,
      queue: q,
      qty: 2,
      handler: async () => {
        seen.push(await preparedIn(sql));
      },
    });
    await worker.run({ maxTasks: 4 });
    const statements = seen[seen.length - 1];
    if (t.target === "direct") {
      assert(await prepares(sql));
      assert(statements.some((s) => s.includes("pgfence.claim(")), String(statements));
      assert(statements.some((s) => s.includes("pgfence.complete_many(")), String(statements));
    } else {
      assertEquals([await prepares(sql), statements], [false, []]);
    }
    assertEquals(worker.verdicts.accepted, 4);
  } finally {
    await sql.end();
  }
});

testDirect("detection needs no privilege: a worker role's pool is found direct", async (t) => {
  const role = t.name("worker").replaceAll("-", "_");
  await t.admin.unsafe(`create role ${role} login in role pgfence_worker`);
  try {
    const url = new URL(t.url);
    url.username = role;
    const sql = connect(url.href, { max: 1, onnotice: () => {} });
    try {
      // What detection reads only over a unix socket: the server's socket directories, which
      // a role without pg_read_all_settings may not read.
      await rejects(
        sql`select current_setting('unix_socket_directories')`,
        (e) => (e as { code?: string }).code === "42501",
      );
      assert(await prepares(sql));
    } finally {
      await sql.end();
    }
  } finally {
    await t.admin.unsafe(`drop role ${role}`);
  }
});

testDirect(
  "why they are detected: through a transaction pooler, a pool that prepares fails",
  async (t) => {
    // Two fenced transactions through PgBouncer, while another client holds the server connection
    // the first one prepared its fence on: PgBouncer runs the second on another server connection,
    // where that statement is missing (26000, in a transaction, which postgres.js cannot retry),
    // when the pool prepares (the detector broken: every connection taken for direct). Detected,
    // nothing is prepared and both pass.
    const r = t.name("r");
    await t.admin`select pgfence.register(${r})`;
    const bouncer = t.bouncerUrl;
    assert(bouncer !== undefined, "PGFENCE_DENO_BOUNCER_URL is not set");
    const fencedTwice = async (prepare: boolean | "detect") => {
      const sql = connect(bouncer, { max: 1, prepare, onnotice: () => {} });
      const holder = connect(bouncer, { max: 1, prepare: false });
      const owner = new Owner({ sql, resource: r, renewEvery: 3600 });
      try {
        assert(await owner.acquire());
        await owner.fenced(async (tx) => await tx`select 1`);
        const [inside, held] = [gate(), gate()];
        const holding = holder.begin(async (tx) => {
          await tx`select 1`; // PgBouncer hands it the server connection used last
          inside.open();
          await held.promise;
          await tx`deallocate all`; // what the pool left prepared there
        });
        await inside.promise;
        try {
          return await owner.fenced((_, generation) => Promise.resolve(generation));
        } finally {
          held.open();
          await holding;
        }
      } finally {
        await owner.release();
        await sql.end();
        await holder.end();
      }
    };
    const generation = await fencedTwice("detect");
    assert(typeof generation === "bigint" && generation > 0n, String(generation));
    await rejects(fencedTwice(true), (e) => (e as { code?: string }).code === "26000");
  },
);

// --- past its local deadline unrenewed, the worker leaves ----------------------------------

for (const expired of [true, false]) {
  const name = expired
    ? "past its local deadline unrenewed, the worker reports what it holds and leaves"
    : "control: within its local deadline the worker goes on";
  testDirect(name, async (t) => {
    const [r, q] = [t.name("r"), t.name("q")];
    await t.admin`select pgfence.register(${r})`;
    for (let n = 0; n < 3; n++) await t.admin`select pgfence.enqueue(${q})`;
    const clock = new FakeClock();
    // No renewal comes (renewEvery): only the clock decides.
    const owner = new Owner({
      sql: t.sql,
      resource: r,
      ttl: 30,
      renewEvery: 3600,
      clock: clock.read,
    });
    assert(await owner.acquire());
    const worker = new Worker({
      owner,
      queue: q,
      handlerTimeout: Infinity,
      handler: () => {
        clock.now += expired ? 31 : 5;
      },
    });
    await worker.run({ untilIdle: true });
    assertEquals([worker.handled, worker.verdicts.accepted], expired ? [1, 1] : [3, 3]);
    assert(!owner.valid);
  });
}

// --- take only what can finish by a deadline ------------------------------------------------

for (const deadline of [true, false]) {
  const name = deadline
    ? "run({ deadline }) claims nothing that could not finish by then"
    : "negative control: without a deadline the worker claims on";
  testDirect(name, async (t) => {
    const [r, q] = [t.name("r"), t.name("q")];
    await t.admin`select pgfence.register(${r})`;
    for (let n = 0; n < 3; n++) await t.admin`select pgfence.enqueue(${q})`;
    const clock = new FakeClock();
    const owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600, clock: clock.read });
    assert(await owner.acquire());
    const worker = new Worker({
      owner,
      queue: q,
      handlerTimeout: 10,
      handler: () => {
        clock.now += 6;
      },
    });
    await worker.run({ maxTasks: 3, deadline: deadline ? clock.now + 15 : undefined });
    // At 100 a task could finish by 110; at 106, not by 115.
    assertEquals(worker.handled, deadline ? 1 : 3);
  });
}

// --- shutdown: Supabase's Edge Runtime, stood in for ----------------------------------------

/**
 * A stand-in for the Edge Runtime while `fn` runs: `EdgeRuntime.waitUntil` records its
 * promises, and `unload(reason)` dispatches `beforeunload` on globalThis as the runtime does
 * (supabase/edge-runtime, ext/runtime/js/bootstrap.js: a cancelable CustomEvent whose detail is
 * `{ reason }`).
 */
async function inEdgeRuntime(
  fn: (waited: Promise<unknown>[], unload: (reason: string) => void) => Promise<void>,
): Promise<void> {
  const waited: Promise<unknown>[] = [];
  const global = globalThis as { EdgeRuntime?: unknown };
  global.EdgeRuntime = { waitUntil: (p: Promise<unknown>) => waited.push(p) };
  const unload = (reason: string) =>
    globalThis.dispatchEvent(
      new CustomEvent("beforeunload", { cancelable: true, detail: { reason } }),
    );
  try {
    await fn(waited, unload);
  } finally {
    delete global.EdgeRuntime;
  }
}

/** Records the reports it sends. */
class CountingReports extends Worker {
  reports: string[] = [];
  protected override report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict | null> {
    this.reports.push(kind);
    return super.report(kind, attemptId, body);
  }
}

async function workerAtBeforeunload(
  t: Target,
  options: { listen: boolean; grace: number; finish: boolean },
): Promise<{ worker: CountingReports; q: string; r: string; waited: number }> {
  const [r, q] = [t.name("w"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 1; n <= 3; n++) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const owner = new Owner({ sql: t.sql, resource: r, renewEvery: 3600 });
  assert(await owner.acquire());
  let worker!: CountingReports;
  let waited = 0;
  const late = gate();
  const returned = gate();
  await inEdgeRuntime(async (promises, unload) => {
    worker = new CountingReports({
      owner,
      queue: q,
      shutdownGrace: options.grace,
      handler: async (payload) => {
        if ((payload as { n: number }).n === 1) {
          unload("wall_clock");
          // Cannot finish within the grace (unless the worker did not stop: then the test
          // fails on what it did instead of waiting forever).
          if (!options.finish && worker.stoppedBy !== null) await late.promise;
        }
        returned.open();
        return payload;
      },
    });
    const remove = options.listen ? worker.installShutdown() : () => {};
    try {
      await worker.run({ untilIdle: true });
    } finally {
      remove();
    }
    waited = promises.length;
    await Promise.all(promises);
  });
  late.open(); // the handed-back handler returns after the worker left ...
  await returned.promise;
  await new Promise((resolve) => setTimeout(resolve, 0)); // ... and would have reported by now
  return { worker, q, r, waited };
}

test("beforeunload drains: the task in hand finishes, nothing more is claimed, released", async (t) => {
  const { worker, q, r, waited } = await workerAtBeforeunload(t, {
    listen: true,
    grace: 3600,
    finish: true,
  });
  assertEquals([worker.stoppedBy, worker.handled, worker.handedBack, waited], [
    "beforeunload: wall_clock",
    1,
    0,
    1,
  ]);
  assertEquals(
    await t.rows(t.admin`select state, count(*)::int as n from pgfence.tasks where queue = ${q}
                          group by state order by state`),
    [{ state: "completed", n: 1 }, { state: "queued", n: 2 }],
  );
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}`),
    [{ status: "released" }],
  );
});

test("beforeunload: a task that cannot finish within the grace is handed back, unreported", async (t) => {
  const { worker, q, r } = await workerAtBeforeunload(t, { listen: true, grace: 0, finish: false });
  assertEquals([worker.handled, worker.handedBack, worker.reports], [0, 1, []]);
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}`),
    [{ status: "released" }],
  );
  // It returns to the queue when its visibility runs out, for a new attempt.
  const [task] = await t.admin`select task_id, state, attempt, lease_id from pgfence.tasks
                                where queue = ${q} and payload->>'n' = '1'`;
  assertEquals([task.state, task.attempt], ["claimed", 1]);
  await t.admin`update pgfence.tasks set visible_until = clock_timestamp() - interval '1 ms'
                 where task_id = ${task.task_id as string}`;
  await t.admin`select pgfence.requeue_expired()`;
  assertEquals(
    await t.rows(
      t.admin`select state from pgfence.tasks where task_id = ${task.task_id as string}`,
    ),
    [{ state: "queued" }],
  );
  const [lease] = await t.admin`select * from pgfence.acquire(${r}, 'next', '30 s')`;
  const [again] = await t.admin`select task_id, attempt from pgfence.claim(${lease
    .lease_id as string}::uuid, ${q}, 3, '30 s') order by task_id`;
  assertEquals([again.task_id, again.attempt], [task.task_id, 2]);
});

test("negative control: a worker that does not listen works on after beforeunload", async (t) => {
  const { worker, q } = await workerAtBeforeunload(t, { listen: false, grace: 0, finish: true });
  assertEquals([worker.stoppedBy, worker.handled], [null, 3]);
  assertEquals(
    await t.rows(t.admin`select count(*)::int as n from pgfence.tasks
                          where queue = ${q} and state = 'completed'`),
    [{ n: 3 }],
  );
});

// --- supervision: the one loop keeps any worker across leases and faults ----------------------

/** An owner whose statements fail once at the steps named: what postgres.js throws when a
 * connection breaks, or from inside itself. */
class FaultyOwner extends Owner {
  faults: Map<string, () => Error> = new Map();
  protected override beforeStep(step: string): void {
    const fault = this.faults.get(step);
    if (fault === undefined) return;
    this.faults.delete(step);
    throw fault();
  }
}

test("supervise keeps a Worker going through faults until stop, backing off", async (t) => {
  const [r, q] = [t.name("w"), t.name("q")];
  await t.admin`select pgfence.register(${r})`;
  for (let n = 1; n <= 2; n++) await t.admin`select pgfence.enqueue(${q}, ${t.admin.json({ n })})`;
  const owner = new FaultyOwner({ sql: t.sql, resource: r });
  owner.faults.set(
    "claim",
    () => new TypeError("Cannot read properties of null (reading 'write')"),
  );
  owner.faults.set("release", () => new ConnectionLost("socket ended", "ECONNRESET"));
  const waits: number[] = [];
  const worker = new (class extends Worker {
    protected override pause(seconds: number): Promise<void> {
      waits.push(seconds);
      return super.pause(seconds);
    }
  })({ owner, queue: q, idleWait: 0.05, handler: (p) => p, backoff: { base: 0.01, cap: 0.05 } });
  const done = worker.supervise();
  await t.waitUntil(async () => {
    const [{ n }] = await t.admin`select count(*)::int as n from pgfence.tasks
                                   where queue = ${q} and state = 'completed'`;
    return n === 2;
  }, "both tasks");
  worker.stop();
  await done; // resolves: no fault ended it
  assertEquals([worker.faults, worker.handled, owner.faults.size], [1, 2, 0]);
  assert(waits.length >= 1 && waits[0] <= 0.01, `it waited ${waits} after the fault`);
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${r}
                          order by generation desc limit 1`),
    [{ status: "released" }],
  );
});

test("supervise ends on an error no retry mends (PF002: no such resource)", async (t) => {
  const owner = new Owner({ sql: t.sql, resource: t.name("nosuch") });
  const worker = new Worker({ owner, queue: t.name("q"), handler: () => null });
  await rejects(worker.supervise(), ResourceUnknown);
  assertEquals(worker.faults, 0);
});

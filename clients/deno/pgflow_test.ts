/**
 * The pgflow worker (pgflow.ts) against the real pgflow of tests/test_deno_pgflow.py's
 * database (pgmq, pgflow 0.8.1 from npm, pgfence and its layers), directly and through
 * PgBouncer (test_support.ts): a flow defined with npm's @pgflow/dsl, compiled by pgflow's own
 * compiler, run end to end through the fenced protocol by the one-line start; and a refused
 * worker's backoff, with its negative control (a worker without backoff).
 *
 * @module
 */
import { compileFlow, Flow } from "@pgflow/dsl";
import {
  ensureFlowCompiled,
  FlowNotCompiled,
  FlowWorker,
  type StepContext,
  type StepTask,
} from "./pgflow.ts";
import { connect, ConnectionLost, Owner, prepares, type Sql } from "./mod.ts";
import {
  assert,
  assertEquals,
  FakeClock,
  gate,
  rejects,
  type Target,
  test,
} from "./test_support.ts";

/** A slug of this test's own: pgflow's slugs allow letters, digits and underscores. */
function slug(t: Target, base: string): string {
  return t.name(base).replaceAll("-", "_");
}

/** The flow's definition in the database, by pgflow's own compiler (what `pgflow compile`
 * writes into a migration). */
async function install(t: Target, flow: Flow): Promise<void> {
  for (const statement of compileFlow(flow)) await t.admin.unsafe(statement);
}

/** A flow with each kind of step: a root step, a dependent one, an array and a map over it. */
function dslFlow(flowSlug: string, seen: Record<string, unknown[]>) {
  const record = (step: string, input: unknown, context: StepContext) => {
    (seen[step] ??= []).push({ input, stepTask: context.stepTask.step_slug });
  };
  return new Flow<{ n: number }>({ slug: flowSlug, timeout: 10, maxAttempts: 2 })
    .step({ slug: "first" }, async (input, context) => {
      record("first", input, context as unknown as StepContext);
      // A handler's writes are fenced by its task's lease: the context's owner holds it.
      const { owner } = context as unknown as StepContext;
      (seen.fenced ??= []).push(
        await owner.fenced((_tx, generation) => Promise.resolve(generation)),
      );
      return { seen: input.run.n };
    })
    .step({ slug: "second", dependsOn: ["first"] }, (input, context) => {
      record("second", input, context as unknown as StepContext);
      return { from_first: input.first.seen };
    })
    .array({ slug: "list", dependsOn: ["first"] }, (input) => [input.run.n, input.first.seen + 1])
    .map({ slug: "square", array: "list" }, (item, context) => {
      record("square", item, context as unknown as StepContext);
      return item * item;
    });
}

test("a @pgflow/dsl flow, compiled by pgflow, runs end to end in one line", async (t) => {
  const [flowSlug, resource] = [slug(t, "dsl"), t.name("fn")];
  const seen: Record<string, unknown[]> = {};
  const flow = dslFlow(flowSlug, seen);
  await install(t, flow as unknown as Flow);
  await t.admin`select pgfence.register(${resource})`;
  const [{ run_id: runId }] = await t.admin`select run_id
                                              from pgflow.start_flow(${flowSlug}, '{"n": 3}')`;
  // The drop-in: pgflow's `EdgeWorker.start(flow)`, with the database and the resource.
  const worker = FlowWorker.start(flow, { sql: t.sql, resource, idleWait: 0.05, qty: 5 });
  await t.waitUntil(async () => {
    const [{ status }] = await t.admin`select status from pgflow.runs where run_id = ${runId}`;
    return status !== "started";
  }, "the run to finish");
  worker.stop();
  await worker.done;
  assertEquals(
    await t.rows(t.admin`select status, output from pgflow.runs where run_id = ${runId}`),
    [{ status: "completed", output: { second: { from_first: 3 }, square: [9, 16] } }],
  );
  // EdgeWorker's inputs: the run's input and the dependencies' outputs; a map's items alone.
  assertEquals(seen.first, [{ input: { run: { n: 3 } }, stepTask: "first" }]);
  const [{ generation }] = await t.admin`select generation from pgfence.leases
                                          where resource = ${resource}`;
  assertEquals(seen.fenced, [BigInt(generation)]); // fenced by the lease of the task's start
  assertEquals(seen.second, [{ input: { run: { n: 3 }, first: { seen: 3 } }, stepTask: "second" }]);
  assertEquals(
    (seen.square as { input: number }[]).map((s) => s.input).sort(),
    [3, 4],
  );
  assertEquals(worker.verdicts, { accepted: 5, duplicate: 0, stale: 0 });
  assertEquals([worker.faults, worker.lastFault, worker.refusals], [0, null, 0]);
  assertEquals(worker.handlerTimeout("first"), 10); // the flow's timeout
  assertEquals(
    await t.rows(t.admin`select status from pgfence.lease_status where resource = ${resource}`),
    [{ status: "released" }],
  );
});

/** A worker that counts its refusals, records its waits, and stops at its `limit`-th. */
class Counting extends FlowWorker {
  waits: number[] = [];
  limit = Infinity;
  protected override pause(seconds: number): Promise<void> {
    this.waits.push(seconds);
    if (this.waits.length >= this.limit) this.stop();
    return super.pause(seconds);
  }
}

/** Negative control: a worker without backoff, which asks again at once. */
class NoBackoff extends Counting {
  override refusalWait(): number {
    return 0;
  }
}

/**
 * How many of its tries a worker makes within its first second, by the waits it chose (the
 * first try at once, each next one after a wait). Counted from the waits, not in a window of
 * real time: on a loaded machine a spinning worker's round trips are slow, and a window then
 * shows it as patient (16 tries in a second at 5 % of a CPU, where the control wants 20).
 */
function triesInASecond(waits: number[]): number {
  let at = 0;
  let tries = 0;
  for (const wait of [0, ...waits.slice(0, -1)]) {
    at += wait;
    if (at < 1) tries += 1;
  }
  return tries;
}

/** A worker of a disabled resource (PF003 at every acquire), stopped at its `limit`-th
 * refusal, and the seconds of real time it ran. */
async function refused(
  t: Target,
  make: typeof Counting,
  limit: number,
): Promise<[Counting, number]> {
  const [flowSlug, resource] = [slug(t, "off"), t.name("fn")];
  const flow = dslFlow(flowSlug, {});
  await install(t, flow as unknown as Flow);
  await t.admin`select pgfence.register(${resource}, false)`;
  const worker = new make({
    owner: new Owner({ sql: t.sql, resource }),
    flow: flow as unknown as Flow,
    backoff: { base: 0.05, cap: 0.2, random: () => 0.999 },
  });
  worker.limit = limit;
  const started = performance.now();
  await worker.supervise();
  return [worker, (performance.now() - started) / 1000];
}

test("a refused worker backs off, capped and jittered, and never spins", async (t) => {
  const [worker, seconds] = await refused(t, Counting, 8);
  assertEquals([worker.refusals, worker.handled], [8, 0]);
  // 0.05, 0.1, 0.2, 0.2, ... (times 0.999): at most 1 + 7 tries in a second.
  assertEquals(
    worker.waits.slice(0, 4).map((w) => Math.round(w * 1000)),
    [50, 100, 200, 200],
  );
  assert(triesInASecond(worker.waits) <= 8, `waits ${worker.waits}`);
  // And it waited them: in real time, at least the waits before its last refusal (a lower
  // bound, which a slow machine only exceeds; a little under for a timer that fires early).
  const waited = worker.waits.slice(0, -1).reduce((sum, w) => sum + w, 0);
  assert(seconds >= 0.9 * waited, `${seconds} s for ${waited} s of waits`);
});

test("negative control: a worker without backoff is refused on every poll", async (t) => {
  const [worker] = await refused(t, NoBackoff, 20);
  const tries = triesInASecond(worker.waits);
  assert(tries >= 20, `only ${tries} tries in its first second`); // ours: at most 8
});

/** A one-step flow whose handler waits for `release` (a runtime that survives its lease). */
function heldFlow(flowSlug: string, entered: () => void, release: Promise<void>) {
  return new Flow<{ n: number }>({ slug: flowSlug, timeout: 10 })
    .step({ slug: "only" }, async () => {
      entered();
      await release;
      return { done: true };
    });
}

/** Runs `start` (an invocation's worker, or a supervisor without one) until its lease is
 * superseded mid-handler and the successor releases; returns the owner's leases then. */
async function supersededMidHandler(
  t: Target,
  withInvocation: boolean,
): Promise<{ worker: FlowWorker; leases: number; resource: string }> {
  const [flowSlug, resource, owner] = [slug(t, "held"), t.name("fn"), t.name("edge")];
  const inHandler = gate();
  const release = gate();
  const flow = heldFlow(flowSlug, () => inHandler.open(), release.promise);
  await install(t, flow as unknown as Flow);
  await t.admin`select pgfence.register(${resource})`;
  await t.admin`select pgflow.start_flow(${flowSlug}, '{"n": 1}')`;
  const [{ id }] = await t.admin`select pgfence.request_start(${resource}) as id`;
  const worker = FlowWorker.start(flow as unknown as Flow, {
    sql: t.sql,
    resource,
    owner,
    invocationId: withInvocation ? id as string : null,
    idleWait: 0.05,
    backoff: { base: 0.01, cap: 0.05 },
  });
  await inHandler.promise;
  // The runtime survives, its lease does not: it runs out, and a successor takes over.
  await t.admin`select pgfence_test.expire(lease_id) from pgfence.leases where owner = ${owner}`;
  const [{ lease_id: successor }] = await t.admin`select lease_id
                                                    from pgfence.acquire(${resource}, 'successor',
                                                                         '30 seconds')`;
  release.open();
  await t.admin`select pgfence.release(${successor})`;
  if (withInvocation) {
    await worker.done;
  } else {
    await t.waitUntil(async () => {
      const [{ n }] = await t.admin`select count(*)::int as n from pgfence.leases
                                     where owner = ${owner}`;
      return n >= 2;
    }, "the supervisor to acquire again");
    worker.stop();
    await worker.done;
  }
  const [{ n }] = await t.admin`select count(*)::int as n from pgfence.leases
                                 where owner = ${owner}`;
  return { worker, leases: n, resource };
}

test("a surviving runtime whose lease was superseded needs a fresh invocation", async (t) => {
  const { worker, leases, resource } = await supersededMidHandler(t, true);
  assertEquals(leases, 1); // it ended with its term: no lease without a new invocation
  assertEquals(worker.verdicts, { accepted: 1, duplicate: 0, stale: 0 }); // nobody overtook it
  // The supervisor's next request carries a new id, and a new runtime acquires with it.
  const [{ id }] = await t.admin`select pgfence.request_start(${resource}) as id`;
  assert(id !== null, "a fresh request");
  const owner = new Owner({ sql: t.sql, resource });
  assert(await owner.acquire(id as string));
  await owner.release();
});

test("negative control: a supervisor without the handshake acquires again by itself", async (t) => {
  const { leases } = await supersededMidHandler(t, false);
  assert(leases >= 2, `${leases} leases`);
});

// --- visibility per task ---------------------------------------------------------------------

/** A flow of one root step, `only`, whose timeout in the database is `timeout` seconds. */
async function oneStep(t: Target, base: string, timeout: number): Promise<string> {
  const flowSlug = slug(t, base);
  const flow = new Flow<{ n: number }>({ slug: flowSlug, timeout }).step(
    { slug: "only" },
    () => null,
  );
  await install(t, flow as unknown as Flow);
  return flowSlug;
}

/** Whether message `msgId` of `flowSlug`'s queue is hidden now (its vt ahead of the clock). */
async function hidden(t: Target, flowSlug: string, msgId: bigint): Promise<boolean> {
  const [{ hidden }] = await t.admin.unsafe(
    `select vt > clock_timestamp() as hidden from pgmq.q_${flowSlug} where msg_id = $1`,
    [String(msgId)],
  );
  return hidden as boolean;
}

test("without a DSL flow, a handler's deadline is the step's timeout in the database", async (t) => {
  const [resource, clock] = [t.name("fn"), new FakeClock()];
  const flowSlug = await oneStep(t, "dbtimeout", 3);
  await t.admin`select pgfence.register(${resource})`;
  await t.admin`select pgflow.start_flow(${flowSlug}, '{"n": 1}')`;
  const owner = new Owner({ sql: t.sql, resource, clock: clock.read });
  assert(await owner.acquire());
  const seen: number[] = [];
  const worker = new FlowWorker({
    owner,
    flowSlug,
    handlers: {
      only: (_input, context) => {
        seen.push(context.deadline - clock.now, worker.handlerTimeout(context.task));
        return null;
      },
    },
  });
  await worker.run({ untilIdle: true });
  assertEquals(seen, [3, 3]); // not pgflow's 60
});

/** A worker whose start holds a batch only for its tasks' step's timeout + 2 s, not for the
 * batch (0.3.0's): what a later task of a batch meets once a handler before it ran long (past
 * its deadline, or extending itself), without running a handler that long here. */
function unheld(options: ConstructorParameters<typeof FlowWorker>[0]): FlowWorker {
  const worker = new CountingCalls(options);
  worker.unheld = true;
  return worker;
}

test("a later task of a batch whose visibility ran short is extended before it starts", async (t) => {
  const [resource, clock] = [t.name("fn"), new FakeClock()];
  const flowSlug = await oneStep(t, "batch", 5);
  await t.admin`select pgfence.register(${resource})`;
  for (const n of [1, 2]) {
    await t.admin`select pgflow.start_flow(${flowSlug}, ${t.admin.json({ n })})`;
  }
  const owner = new Owner({ sql: t.sql, resource, clock: clock.read });
  assert(await owner.acquire());
  const hiddenAtStart: boolean[] = [];
  const worker: FlowWorker = unheld({
    owner,
    flowSlug,
    qty: 2,
    handlers: {
      only: async (_input, { task }) => {
        hiddenAtStart.push(await hidden(t, flowSlug, task.msgId));
        if (hiddenAtStart.length === 1) {
          // Time passes for both: 4 of the second task's 7 s (5 + 2) are used up, and the
          // database sees its message's visibility run out.
          clock.now += 4;
          await t.admin.unsafe(
            `update pgmq.q_${flowSlug} set vt = clock_timestamp() - interval '1 ms'
              where msg_id <> $1`,
            [String(task.msgId)],
          );
        }
        return null;
      },
    },
  });
  await worker.run({ untilIdle: true });
  // The second handler started with its message hidden again, for its deadline.
  assertEquals([hiddenAtStart, worker.handled, worker.skipped], [[true, true], 2, 0]);
});

test("a later task of a batch taken over meanwhile is skipped, not started", async (t) => {
  const [resource, other, clock] = [t.name("fn"), t.name("other-fn"), new FakeClock()];
  const flowSlug = await oneStep(t, "skip", 5);
  for (const r of [resource, other]) await t.admin`select pgfence.register(${r})`;
  for (const n of [1, 2]) {
    await t.admin`select pgflow.start_flow(${flowSlug}, ${t.admin.json({ n })})`;
  }
  const owner = new Owner({ sql: t.sql, resource, clock: clock.read });
  assert(await owner.acquire());
  const ran: unknown[] = [];
  const worker: FlowWorker = unheld({
    owner,
    flowSlug,
    qty: 2,
    handlers: {
      only: async (input, { task }) => {
        ran.push(input);
        if (ran.length === 1) {
          // The second task's time runs out (it stalls: its message back past its step's
          // timeout + 2 s), and another worker function takes it over.
          clock.now += 4;
          await t.admin.unsafe(
            `select pgfence_test.stall_task($1, st.message_id) from pgflow.step_tasks st
              where st.flow_slug = $1 and st.status = 'started' and st.message_id <> $2`,
            [flowSlug, String(task.msgId)],
          );
          const [{ lease_id }] = await t.admin`select lease_id
                                                 from pgfence.acquire(${other}, 'other', '1 hour')`;
          const taken = await t.admin`select step_slug from pgfence_pgflow.start_tasks(
                                        ${lease_id as string}::uuid, ${flowSlug}, ${flowSlug},
                                        '30 s', 1)`;
          assertEquals(taken.length, 1);
        }
        return null;
      },
    },
  });
  await worker.run({ untilIdle: true });
  assertEquals([ran.length, worker.handled, worker.skipped], [1, 1, 1]);
  assertEquals(
    await t.rows(t.admin`select attempts_count, status from pgflow.step_tasks
                          where flow_slug = ${flowSlug} order by attempts_count, status`),
    [{ attempts_count: 1, status: "completed" }, { attempts_count: 2, status: "started" }],
  );
});

/** A FlowWorker that counts its extends and its reports, one by one and in batches; with
 * `unheld`, a start that holds a batch only for the read's visibility (0.3.0's: the negative
 * control of the hold). */
class CountingCalls extends FlowWorker {
  extends = 0;
  reports = 0;
  batches: number[] = [];
  unheld = false;
  override get hold(): number {
    return this.unheld ? this.visibility : super.hold;
  }
  protected override extend(attemptId: string, visibility: number): Promise<Date | null> {
    this.extends += 1;
    return super.extend(attemptId, visibility);
  }
  protected override report(kind: "complete" | "fail", attemptId: string, body: unknown) {
    this.reports += 1;
    return super.report(kind, attemptId, body);
  }
  protected override reportMany(results: { task: StepTask; body: unknown }[]): Promise<void> {
    this.batches.push(results.length);
    return super.reportMany(results);
  }
}

/** A batch of three tasks of a step with a 5 s timeout, each handler using 4 s of the owner's
 * clock: what the worker did, and the seconds each message had left in the database when its
 * handler started. */
async function heldBatch(t: Target, base: string, unheld: boolean) {
  const [resource, clock] = [t.name("fn"), new FakeClock()];
  const flowSlug = await oneStep(t, base, 5);
  await t.admin`select pgfence.register(${resource})`;
  for (const n of [1, 2, 3]) {
    await t.admin`select pgflow.start_flow(${flowSlug}, ${t.admin.json({ n })})`;
  }
  const owner = new Owner({ sql: t.sql, resource, clock: clock.read });
  assert(await owner.acquire());
  const left: number[] = [];
  const worker = new CountingCalls({
    owner,
    flowSlug,
    qty: 3,
    reportWithin: 3600,
    handlers: {
      only: async (input, { task }) => {
        const [{ seconds }] = await t.admin.unsafe(
          `select extract(epoch from vt - clock_timestamp())::float8 as seconds
             from pgmq.q_${flowSlug} where msg_id = $1`,
          [String(task.msgId)],
        );
        left.push(seconds as number);
        clock.now += 4; // within the handler's 5 s
        return { n: (input as { run: { n: number } }).run.n };
      },
    },
  });
  worker.unheld = unheld;
  await worker.run({ untilIdle: true });
  const outputs = await t.rows(t.admin`select status, output from pgflow.step_tasks
                                        where flow_slug = ${flowSlug} order by message_id`);
  return { worker, left, outputs };
}

test("a batch's start holds its tasks for the batch: no extend before a handler", async (t) => {
  const { worker, left, outputs } = await heldBatch(t, "held", false);
  // Held for 3 × 5 s: the third handler starts 8 s in, with 7 s left, more than its 5.
  assertEquals([worker.hold, worker.extends, worker.handled, worker.skipped], [15, 0, 3, 0]);
  assert(left.every((s) => s > 12), `${left} s left in the database`); // not 7
  assertEquals(outputs, [1, 2, 3].map((n) => ({ status: "completed", output: { n } })));
});

test("negative control: a start held only for the read needs an extend per later task", async (t) => {
  const { worker } = await heldBatch(t, "unheld", true);
  assertEquals([worker.extends, worker.handled], [2, 3]);
});

test("a batch's results go in one complete_many, each verdict counted", async (t) => {
  const { worker, outputs } = await heldBatch(t, "many", false);
  assertEquals([worker.batches, worker.reports], [[3], 0]); // no complete_task
  assertEquals(worker.verdicts, { accepted: 3, duplicate: 0, stale: 0 });
  assertEquals(outputs.length, 3);
});

test("prepared statements on a direct connection, none through PgBouncer", async (t) => {
  const resource = t.name("fn");
  const flowSlug = await oneStep(t, "prep", 5);
  await t.admin`select pgfence.register(${resource})`;
  for (let n = 0; n < 4; n++) {
    await t.admin`select pgflow.start_flow(${flowSlug}, ${t.admin.json({ n })})`;
  }
  const sql = connect(t.url, { max: 1, onnotice: () => {} }); // detected (the default)
  const preparedIn = async (sql: Sql) =>
    (await sql`select statement from pg_prepared_statements
                where statement like '%pgfence_pgflow.%' order by statement`)
      .map((r) => r.statement as string);
  try {
    const owner = new Owner({ sql, resource, renewEvery: 3600 });
    assert(await owner.acquire());
    const seen: string[][] = [];
    // Between the worker's statements, on its one connection: the second batch's handlers see
    // what the first batch's start and complete_many left prepared.
    const worker = new FlowWorker({
      owner,
      flowSlug,
      qty: 2,
      handlers: {
        only: async () => {
          seen.push(await preparedIn(sql));
          return null;
        },
      },
    });
    await worker.run({ maxTasks: 4 });
    const statements = seen[seen.length - 1];
    if (t.target === "direct") {
      assert(await prepares(sql));
      assert(statements.some((s) => s.includes("pgfence_pgflow.start_tasks(")), String(statements));
      assert(
        statements.some((s) => s.includes("pgfence_pgflow.complete_many(")),
        String(statements),
      );
    } else {
      assertEquals([await prepares(sql), statements], [false, []]);
    }
    assertEquals(worker.verdicts.accepted, 4);
  } finally {
    await sql.end();
  }
});

test("a handler longer than its step's timeout starts only once its message is kept that long", async (t) => {
  const resource = t.name("fn");
  const flowSlug = await oneStep(t, "long", 5);
  await t.admin`select pgfence.register(${resource})`;
  await t.admin`select pgflow.start_flow(${flowSlug}, '{"n": 1}')`;
  const owner = new Owner({ sql: t.sql, resource });
  assert(await owner.acquire());
  const left: number[] = [];
  const worker = new FlowWorker({
    owner,
    flowSlug,
    handlerTimeout: 3600,
    handlers: {
      only: async (_input, { task }) => {
        const [{ seconds }] = await t.admin.unsafe(
          `select extract(epoch from vt - clock_timestamp())::float8 as seconds
             from pgmq.q_${flowSlug} where msg_id = $1`,
          [String(task.msgId)],
        );
        left.push(seconds as number);
        return null;
      },
    },
  });
  await worker.run({ untilIdle: true });
  assert(left.length === 1 && left[0] > 3000, `${left} s of visibility left`); // not 7
});

// --- the one loop: shutdown and faults of the one-line start ---------------------------------

/**
 * A stand-in for Supabase's Edge Runtime while `fn` runs: `EdgeRuntime.waitUntil` records its
 * promises, and `unload(detail)` dispatches `beforeunload` on globalThis as the runtime does
 * (supabase/edge-runtime, ext/runtime/js/bootstrap.js: a cancelable CustomEvent whose detail is
 * `{ reason }`; Supabase's functions-js types the detail as the reason itself).
 */
async function inEdgeRuntime(
  fn: (waited: Promise<unknown>[], unload: (detail: unknown) => void) => Promise<void>,
): Promise<void> {
  const waited: Promise<unknown>[] = [];
  const global = globalThis as { EdgeRuntime?: unknown };
  global.EdgeRuntime = { waitUntil: (p: Promise<unknown>) => waited.push(p) };
  const unload = (detail: unknown) =>
    globalThis.dispatchEvent(new CustomEvent("beforeunload", { cancelable: true, detail }));
  try {
    await fn(waited, unload);
  } finally {
    delete global.EdgeRuntime;
  }
}

for (const detail of [{ reason: "wall_clock" }, "wall_clock"]) {
  const shape = typeof detail === "string" ? "the reason" : "{ reason }";
  test(`beforeunload (detail: ${shape}) drains a one-line start and releases`, async (t) => {
    const [flowSlug, resource, name] = [slug(t, "unload"), t.name("fn"), t.name("edge")];
    const inHandler = gate();
    const release = gate();
    const flow = heldFlow(flowSlug, () => inHandler.open(), release.promise);
    await install(t, flow as unknown as Flow);
    await t.admin`select pgfence.register(${resource})`;
    for (const n of [1, 2]) {
      await t.admin`select pgflow.start_flow(${flowSlug}, ${t.admin.json({ n })})`;
    }
    await inEdgeRuntime(async (waited, unload) => {
      const worker = FlowWorker.start(flow as unknown as Flow, {
        sql: t.sql,
        resource,
        owner: name,
        idleWait: 0.05,
        shutdownGrace: 3600,
      });
      await inHandler.promise;
      unload(detail);
      assertEquals(worker.stoppedBy, "beforeunload: wall_clock"); // at once, in the event
      // The isolate is kept alive (EdgeRuntime.waitUntil) while the task is in hand.
      let settled = 0;
      for (const p of waited) p.finally(() => settled++);
      await new Promise((resolve) => setTimeout(resolve, 0)); // what has settled, has
      assert(settled < waited.length, "nothing keeps the isolate alive");
      release.open(); // the task in hand finishes within the grace ...
      await worker.done; // ... and the worker ends: no other task, no other lease
      await Promise.all(waited);
      assertEquals([worker.handled, worker.handedBack], [1, 0]);
    });
    assertEquals(
      await t.rows(t.admin`select status from pgfence.lease_status where owner = ${name}`),
      [{ status: "released" }],
    );
    assertEquals(
      await t.rows(t.admin`select status, count(*)::int as n from pgflow.step_tasks
                            where flow_slug = ${flowSlug} group by status order by status`),
      [{ status: "completed", n: 1 }, { status: "queued", n: 1 }],
    );
  });
}

/** An owner whose statements fail once at the steps named, with the error made for each: what
 * postgres.js throws when a connection breaks, or from inside itself. */
class Faulty extends Owner {
  faults: Map<string, () => Error> = new Map();
  protected override beforeStep(step: string): void {
    const fault = this.faults.get(step);
    if (fault === undefined) return;
    this.faults.delete(step);
    throw fault();
  }
}

test("no fault of the connection or inside the driver ends a supervised worker", async (t) => {
  const [flowSlug, resource] = [slug(t, "faults"), t.name("fn")];
  const flow = dslFlow(flowSlug, {});
  await install(t, flow as unknown as Flow);
  await t.admin`select pgfence.register(${resource})`;
  const [{ run_id: runId }] = await t.admin`select run_id
                                              from pgflow.start_flow(${flowSlug}, '{"n": 2}')`;
  const owner = new Faulty({ sql: t.sql, resource });
  // The first claim meets an error from inside postgres.js (a write on a socket it had
  // nulled), and the release at the end of that term a connection that broke.
  owner.faults.set(
    "claim",
    () => new TypeError("Cannot read properties of null (reading 'write')"),
  );
  owner.faults.set(
    "release",
    () => new ConnectionLost("write CONNECTION_CLOSED", "CONNECTION_CLOSED"),
  );
  const worker = new FlowWorker({
    owner,
    flow: flow as unknown as Flow,
    idleWait: 0.05,
    qty: 5,
    backoff: { base: 0.01, cap: 0.05 },
  });
  const done = worker.supervise();
  await t.waitUntil(async () => {
    const [{ status }] = await t.admin`select status from pgflow.runs where run_id = ${runId}`;
    return status !== "started";
  }, "the run to finish");
  worker.stop();
  await done; // resolves: neither fault ended it
  assertEquals(
    await t.rows(t.admin`select status from pgflow.runs where run_id = ${runId}`),
    [{ status: "completed" }],
  );
  assertEquals([worker.faults, owner.faults.size], [1, 0]);
  assert(worker.lastFault?.startsWith("ConnectionLost") === true, `${worker.lastFault}`);
});

// --- the drop-in entry's start: compile or verify, pgflow's input ------------------------------

/** Whether the database's pgflow compiles flows itself (0.14: ensure_flow_compiled). */
async function compiles(t: Target): Promise<boolean> {
  const [{ ok }] = await t.admin`select to_regprocedure(
      'pgflow.ensure_flow_compiled(text, jsonb, boolean)') is not null as ok`;
  return ok as boolean;
}

test("the flow is compiled or verified as pgflow's worker does, a mismatch refused", async (t) => {
  const flowSlug = slug(t, "compile");
  const flow = dslFlow(flowSlug, {}) as unknown as Flow;
  const other = new Flow({ slug: flowSlug }).step({ slug: "first" }, () => 1)
    .step({ slug: "other", dependsOn: ["first"] }, () => 2) as unknown as Flow;
  if (await compiles(t)) {
    // pgflow 0.14: compiled when missing, then verified; a different flow refused.
    assertEquals(await ensureFlowCompiled(t.sql, flow), "compiled");
    assertEquals(await ensureFlowCompiled(t.sql, flow), "verified");
  } else {
    // pgflow 0.8 compiles nothing at a worker's start: a missing flow is refused, naming the
    // command that compiles it; once compiled (by pgflow's compiler), it is verified.
    const refused = await rejects(ensureFlowCompiled(t.sql, flow), FlowNotCompiled);
    assert(String(refused).includes("npx pgflow compile"), String(refused));
    await install(t, flow);
    assertEquals(await ensureFlowCompiled(t.sql, flow), "verified");
  }
  const mismatch = await rejects(ensureFlowCompiled(t.sql, other), FlowNotCompiled);
  assert((mismatch as FlowNotCompiled).differences.length > 0, String(mismatch));
  assertEquals(await ensureFlowCompiled(t.sql, other, false), "skipped");
});

test("input: pgflow gives handlers the shape the database's pgflow gives its own", async (t) => {
  const [resource, flowSlug] = [t.name("fn"), slug(t, "shape")];
  const seen: Record<string, unknown> = {};
  const flow = new Flow<{ n: number }>({ slug: flowSlug })
    .step({ slug: "first" }, async (input, context) => {
      seen.first = [input, await (context as unknown as StepContext).flowInput];
      return { m: 2 };
    })
    .step({ slug: "second", dependsOn: ["first"] }, async (input, context) => {
      seen.second = [input, await (context as unknown as StepContext).flowInput];
      return null;
    });
  await install(t, flow as unknown as Flow);
  await t.admin`select pgfence.register(${resource})`;
  await t.admin`select pgflow.start_flow(${flowSlug}, '{"n": 1}')`;
  const owner = new Owner({ sql: t.sql, resource });
  assert(await owner.acquire());
  const worker = new FlowWorker({ owner, flow: flow as unknown as Flow, input: "pgflow" });
  await worker.run({ untilIdle: true });
  const [{ ok: new14 }] = await t.admin`select exists (select from pg_attribute
      where attrelid = 'pgflow.step_task_record'::regclass and attname = 'flow_input') as ok`;
  assertEquals(
    seen,
    new14
      ? { first: [{ n: 1 }, { n: 1 }], second: [{ first: { m: 2 } }, { n: 1 }] } // 0.14's
      : {
        first: [{ run: { n: 1 } }, { n: 1 }],
        second: [{ run: { n: 1 }, first: { m: 2 } }, { n: 1 }],
      },
  );
});

/**
 * A worker for tests/test_deno_faults.py, which breaks its connection at one step of the
 * cycle. It works queue $QUEUE of $RESOURCE at $DATABASE_URL, connecting as application $APP:
 * acquire, one renewal, then `run({ untilIdle: true })`, which claims $QTY tasks at a time,
 * handles them, reports (a batch's results in one complete_many), drains and releases. Before each statement it sends (`Owner.beforeStep`), and in each handler
 * call, it prints `{"at": step, "n": k}` (the k-th time at that step) and waits for a line on
 * stdin: there the test breaks the connection, or not, and answers. It prints, awaiting no
 * answer, `{"at": "renewed"}` after each renewal that passed and `{"at": "closed"}` when
 * postgres.js has seen its connection close. At the end it prints what it saw
 * (`{"done": ...}`).
 *
 * A task's payload is `{"n": n}` (its handler returns `{"n": n, "by": $APP}`) or
 * `{"n": n, "fail": true}` (its handler throws). Retries wait a millisecond (jitter 0): the
 * outcome never depends on how long.
 *
 * With $FLOW set, the worker is a `FlowWorker` of that pgflow flow (one step, `only`; its runs'
 * inputs are the payloads), in place of $QUEUE's `Worker`: a batch's results go in one
 * `pgfence_pgflow.complete_many`.
 *
 * $BROKEN names a deliberately broken variant, for the negative controls:
 * - `no-doubt`: a lost connection does not put the lease in doubt (no renewal before the next
 *   claim);
 * - `no-resend`: a report (a complete, a fail, a batch's complete_many) whose connection broke
 *   is not sent again.
 */
import { connect, Owner, type Step, type Task, type Verdict, Worker } from "pgfence";
import { FlowWorker, type StepTask } from "pgfence/pgflow";

function env(name: string): string {
  const value = Deno.env.get(name);
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

const app = env("APP");
const broken = Deno.env.get("BROKEN") ?? "";
const sql = connect(env("DATABASE_URL"), {
  connection: { application_name: app },
  max: 1, // one connection: the test finds its backend by application name
  onnotice: () => {},
  onclose: () => console.log(JSON.stringify({ at: "closed" })),
});

// --- the step protocol: one event at a time, each answered by a line ---------------------

const reader = Deno.stdin.readable.getReader();
const decoder = new TextDecoder();
let buffered = "";

async function line(): Promise<string> {
  while (!buffered.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("stdin closed");
    buffered += decoder.decode(value, { stream: true });
  }
  const end = buffered.indexOf("\n");
  const answer = buffered.slice(0, end);
  buffered = buffered.slice(end + 1);
  return answer;
}

const seen: Record<string, number> = {};
let turn: Promise<unknown> = Promise.resolve();

/** Prints the event and waits for the test's answer; events never overlap. */
function at(point: string, extra: Record<string, unknown> = {}): Promise<void> {
  const mine = turn.then(async () => {
    seen[point] = (seen[point] ?? 0) + 1;
    console.log(JSON.stringify({ at: point, n: seen[point], ...extra }));
    await line();
  });
  turn = mine.catch(() => {});
  return mine;
}

// --- the worker ---------------------------------------------------------------------------

class SteppedOwner extends Owner {
  protected override beforeStep(step: Step): Promise<void> {
    return at(step);
  }

  override async renewOnce(): Promise<string> {
    const state = await super.renewOnce();
    console.log(JSON.stringify({ at: "renewed" }));
    return state;
  }

  protected override connectionLost(): void {
    if (broken !== "no-doubt") super.connectionLost();
  }
}

class SteppedWorker extends Worker {
  protected override report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict | null> {
    if (broken !== "no-resend") return super.report(kind, attemptId, body);
    return this.owner.query(
      kind,
      (sql) =>
        kind === "complete"
          ? sql`select pgfence.complete(${attemptId}::uuid, ${sql.json({ ...body as object })})
                as verdict`
          : sql`select pgfence.fail(${attemptId}::uuid, ${sql.json({ ...body as object })})
                as verdict`,
    ).then(([row]) => {
      const verdict = row.verdict as Verdict;
      this.verdicts[verdict] += 1;
      return verdict;
    });
  }

  protected override async reportMany(results: { task: Task; body: unknown }[]): Promise<void> {
    // One result goes as a complete (`report`, above).
    if (broken !== "no-resend" || results.length === 1) return await super.reportMany(results);
    const rows = await this.owner.query(
      "complete_many",
      (sql) => this.reportManyStatement(sql, results),
    );
    for (const row of rows) this.verdicts[row.verdict as Verdict] += 1;
  }

  protected override async resendResults(
    results: { task: Task; body: unknown }[],
    error: unknown,
  ): Promise<void> {
    if (broken === "no-resend") throw error; // the results rode with a claim: not sent again
    await super.resendResults(results, error);
  }
}

/** The same for a pgflow flow: a batch's results in one pgfence_pgflow.complete_many. */
class SteppedFlowWorker extends FlowWorker {
  protected override async reportMany(
    results: { task: StepTask; body: unknown }[],
  ): Promise<void> {
    if (broken !== "no-resend" || results.length === 1) return await super.reportMany(results);
    const rows = await this.owner.query(
      "complete_many",
      (sql) => this.reportManyStatement(sql, results),
    );
    for (const row of rows) this.verdicts[row.verdict as Verdict] += 1;
  }
}

const owner = new SteppedOwner({
  sql,
  resource: env("RESOURCE"),
  owner: app,
  ttl: 600, // runs out only when the test moves time, on however loaded a machine
  renewEvery: 3600, // no renewal but the one below and those a lost connection calls for
  retry: { random: () => 0 },
});
const runs: Record<string, number> = {};
const handler = async (payload: unknown) => {
  const { n, fail } = payload as { n: number; fail?: boolean };
  runs[n] = (runs[n] ?? 0) + 1;
  await at("handler", { task: n });
  if (fail) throw new Error(`task ${n} fails`);
  return { n, by: app };
};
const loop = {
  owner,
  qty: Number(env("QTY")),
  visibility: 600,
  reportWithin: 3600, // a batch's results wait for it, however long the test takes per step
};
const flow = Deno.env.get("FLOW");
const worker = flow
  ? new SteppedFlowWorker({
    ...loop,
    flowSlug: flow,
    handlerTimeout: 600, // the step's own timeout is LONG as well: nothing runs out meanwhile
    handlers: { only: (input) => handler((input as { run: unknown }).run) },
  })
  : new SteppedWorker({ ...loop, queue: env("QUEUE"), handler });

let error: string | null = null;
try {
  await sql`select 1`; // a backend to break from the first step on
  while (!(await owner.acquire())) await at("standby");
  try {
    await owner.renewOnce();
  } catch {
    // in doubt: the renewer renews again at once
  }
  await worker.run({ untilIdle: true });
} catch (e) {
  error = `${e}`;
}
console.log(JSON.stringify({
  done: {
    error,
    verdicts: worker.verdicts,
    handled: worker.handled,
    skipped: worker.skipped,
    runs,
    lost: owner.lost,
    steps: seen,
  },
}));
// A query caught by a broken connection as it was sent may never settle in postgres.js: end
// the pool without waiting for it.
await sql.end({ timeout: 1 });
Deno.exit(0);

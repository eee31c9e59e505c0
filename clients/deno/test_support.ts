/**
 * What the client's tests share. tests/test_deno_client.py starts the cluster and PgBouncer,
 * installs pgfence and its test helpers (pgtap/helpers) into one database, and passes its URLs:
 *
 *   PGFENCE_DENO_DIRECT_URL   the database, directly (also the tests' admin connection)
 *   PGFENCE_DENO_BOUNCER_URL  the same database through PgBouncer in transaction pooling mode
 *
 * Tests share that database, so every test names its own resources and queues (`Target.name`).
 * Time passing is simulated by pgfence_test's helpers, never by sleeping.
 *
 * @module
 */
import { connect, Owner, type Sql, type Step } from "./mod.ts";

// --- assertions (Deno's std comes from JSR, which this machine cannot reach) ------------------

/** A canonical text of a value: bigints, Dates, nested arrays and plain objects. */
function show(value: unknown): string {
  return JSON.stringify(value, function (key, v) {
    const raw = (this as Record<string, unknown>)[key]; // before Date.prototype.toJSON
    if (typeof v === "bigint") return `${v}n`;
    if (raw instanceof Date) return `Date(${raw.toISOString()})`;
    if (v === undefined) return "undefined";
    if (v === Infinity) return "Infinity";
    return v;
  });
}

export function assert(condition: unknown, message = "assertion failed"): asserts condition {
  if (!condition) throw new Error(message);
}

/** Deep equality by canonical text: key order counts, as it does in a row. */
export function assertEquals(actual: unknown, expected: unknown): void {
  const [a, e] = [show(actual), show(expected)];
  if (a !== e) throw new Error(`not equal:\n  actual:   ${a}\n  expected: ${e}`);
}

/** Awaits a promise that must reject with an error that `check` accepts (a class, a pattern of its
 * message, or a predicate); returns the error. */
export async function rejects(
  promise: Promise<unknown>,
  check: (new (...args: never[]) => Error) | RegExp | ((e: unknown) => boolean),
): Promise<unknown> {
  let error: unknown;
  try {
    await promise;
  } catch (e) {
    error = e;
  }
  if (error === undefined) throw new Error("expected a rejection, got none");
  const ok = check instanceof RegExp
    ? check.test(String(error))
    : check.prototype instanceof Error || check === Error
    ? error instanceof (check as new () => Error)
    : (check as (e: unknown) => boolean)(error);
  if (!ok) throw new Error(`unexpected rejection: ${error}`, { cause: error });
  return error;
}

export interface Target {
  /** `direct` or `pgbouncer`. */
  target: string;
  /** The client's connection: direct or through the pooler. */
  sql: Sql;
  /** Its URL. */
  url: string;
  /** The database through PgBouncer, if the tests were given it. */
  bouncerUrl: string | undefined;
  /** Direct, for setup, checks and the test helpers (expire). */
  admin: Sql;
  /** A name of this test's own (resource, queue, owner). */
  name(base: string): string;
  /** The rows of an admin query, as plain objects. */
  rows(q: Promise<readonly Record<string, unknown>[]>): Promise<Record<string, unknown>[]>;
  /** Polls an admin query until it returns true: waits for the renewer, never for safety. */
  waitUntil(check: () => Promise<boolean>, what: string): Promise<void>;
}

function env(name: string): string | undefined {
  return Deno.env.get(name) || undefined;
}

const TARGETS: [string, string | undefined][] = [
  ["direct", env("PGFENCE_DENO_DIRECT_URL")],
  ["pgbouncer", env("PGFENCE_DENO_BOUNCER_URL")],
];

if (!TARGETS[0][1]) {
  throw new Error(
    "PGFENCE_DENO_DIRECT_URL is not set: run the tests with tests/test_deno_client.py",
  );
}

/** Defines the test once per target (directly and through PgBouncer). */
export function test(name: string, fn: (t: Target) => Promise<void>): void {
  for (const [target, url] of TARGETS) {
    Deno.test({
      name: `${name} [${target}]`,
      ignore: url === undefined,
      fn: () => withTarget(target, url!, fn),
    });
  }
}

/** Defines the test once, directly: for what a pooler cannot change (local deadlines). */
export function testDirect(name: string, fn: (t: Target) => Promise<void>): void {
  Deno.test(name, () => withTarget("direct", TARGETS[0][1]!, fn));
}

async function withTarget(
  target: string,
  url: string,
  fn: (t: Target) => Promise<void>,
): Promise<void> {
  const quiet = { onnotice: () => {} };
  const sql = connect(url, quiet);
  const admin = connect(TARGETS[0][1]!, quiet);
  const suffix = crypto.randomUUID().slice(0, 8);
  try {
    await fn({
      target,
      sql,
      url,
      bouncerUrl: TARGETS[1][1],
      admin,
      name: (base) => `${base}-${suffix}`,
      rows: async (q) => (await q).map((r) => ({ ...r })),
      waitUntil: async (check, what) => {
        // A bound for a hung test only (as testkit's wait_until): what it waits for is another
        // task's progress (a renewer's, a supervisor's), later on a loaded machine.
        const deadline = performance.now() + 600_000;
        while (!(await check())) {
          if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      },
    });
  } finally {
    await sql.end();
    await admin.end();
  }
}

/** A clock the test moves by hand. */
export class FakeClock {
  now = 100;
  read = (): number => this.now;
}

/** A promise and the function that resolves it. */
export function gate<T = void>(): { promise: Promise<T>; open: (value: T) => void } {
  let open!: (value: T) => void;
  const promise = new Promise<T>((resolve) => (open = resolve));
  return { promise, open };
}

/** An Owner that notes the step of each statement it sends (renewals aside). */
export class Recording extends Owner {
  steps: Step[] = [];
  protected override beforeStep(step: Step): void {
    if (step !== "renew") this.steps.push(step);
  }
}

/**
 * The pgfence reference client for Deno (and Supabase Edge Functions), over postgres.js: the
 * TypeScript port of the Python client (src/pgfence/client.py), with the same names where the
 * language allows.
 *
 * - `Owner` holds one lease: acquires it, renews it in the background, knows locally when it
 *   must stop trusting it, runs fenced transactions, drains and releases. Renewal can be tied
 *   to progress (`renewUntil`): past the deadline the renewer drains and stops.
 * - `Worker` claims tasks of pgfence's queue under an Owner, runs a handler under a deadline
 *   (`handlerTimeout`), reports results by attempt id, drains and releases when it leaves.
 *
 * Safety never rests on this module: the database refuses a stale owner whatever the client
 * believes (I1-I5). The client's job is liveness and good manners: stop claiming as soon as
 * ownership is in doubt, so that a stale isolate does as little unfenced work as possible.
 *
 * Every call is one statement, or one `sql.begin` transaction, on a postgres.js client made
 * with `prepare: false` and no session state: it works through PgBouncer or Supavisor in
 * transaction pooling mode.
 *
 * @module
 */
import postgres from "postgres";

/** A postgres.js client (a pool); see `connect`. */
export type Sql = postgres.Sql;
/** The transaction of `sql.begin`: `fence` and the writes it protects must share one. */
export type TransactionSql = postgres.TransactionSql;
/** Seconds on a monotonic clock. */
export type Clock = () => number;

/** The default clock: monotonic, unlike Date.now(), so a wall-clock jump moves no deadline. */
export const monotonic: Clock = () => performance.now() / 1000;

/**
 * A postgres.js client that keeps no session state a transaction pooler could lose: no
 * prepared statements. `options` are postgres.js's, except `prepare`, which stays false.
 */
export function connect(url: string, options: postgres.Options<Record<string, never>> = {}): Sql {
  return postgres(url, { ...options, prepare: false });
}

// --- errors -------------------------------------------------------------------------------

/** An error pgfence raised in the database, by its SQLSTATE (docs/errors.md). */
export class PgfenceError extends Error {
  readonly sqlstate: string;
  readonly hint: string | undefined;

  constructor(sqlstate: string, message: string, hint?: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
    this.sqlstate = sqlstate;
    this.hint = hint;
  }
}

/** PF001: the lease is unknown, released, superseded, draining (for fence) or expired. */
export class LeaseNotCurrent extends PgfenceError {}
/** PF002: the resource is unknown. */
export class ResourceUnknown extends PgfenceError {}
/** PF003: the resource is disabled: a worker started for a paused resource exits cleanly. */
export class ResourceDisabled extends PgfenceError {}
/** PF004: the resource is already in another open update window. */
export class UpdateConflict extends PgfenceError {}
/** PF005: the update token is unknown. */
export class UpdateTokenUnknown extends PgfenceError {}
/** PF007: a write to a protected table in a transaction that did not fence its resource. */
export class UnfencedWrite extends PgfenceError {}
/** 22023: an invalid argument; the message names it. */
export class InvalidArgument extends PgfenceError {}

const BY_SQLSTATE: Record<string, typeof PgfenceError> = {
  PF001: LeaseNotCurrent,
  PF002: ResourceUnknown,
  PF003: ResourceDisabled,
  PF004: UpdateConflict,
  PF005: UpdateTokenUnknown,
  PF007: UnfencedWrite,
  "22023": InvalidArgument,
};

/**
 * The typed error for a database error with one of pgfence's SQLSTATEs (the original is its
 * `cause`); any other error as it is. For the caller's own queries too.
 */
export function pgfenceError(e: unknown): unknown {
  if (e instanceof postgres.PostgresError && e.code in BY_SQLSTATE) {
    return new BY_SQLSTATE[e.code](e.code, e.message, e.hint, { cause: e });
  }
  return e;
}

/** Ownership is lost or in doubt (a client-side verdict): stop claiming and writing at once. */
export class LeaseLost extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "LeaseLost";
  }
}

// --- Owner --------------------------------------------------------------------------------

export interface OwnerOptions {
  /** A client made with `prepare: false` (`connect`); the Owner never ends it. */
  sql: Sql;
  resource: string;
  /** The owner's name, e.g. an execution id; default `owner-` and 8 random hex digits. */
  owner?: string;
  /** The lease's time to live, in seconds (default 30). */
  ttl?: number;
  /** Seconds between renewals (default ttl / 3), in real time. */
  renewEvery?: number;
  /** The clock of the local deadlines (default `monotonic`); tests pass a fake one. */
  clock?: Clock;
}

/**
 * One owner's hold on one resource.
 *
 * `valid` turns false when a renewal is refused, when a fence is refused, or when the local
 * deadline passes: the last successful renewal's *send* time plus the ttl. Measuring from the
 * send keeps a slow success from stretching the lease: the database started the new term no
 * earlier than the request left. It also turns false when a progress deadline set with
 * `renewUntil` passes. `signal` aborts when the owner gives the lease up or learns it is lost,
 * so a handler can pass it to fetch() and stop its own work.
 */
export class Owner {
  readonly sql: Sql;
  readonly resource: string;
  readonly owner: string;
  readonly ttl: number;
  readonly renewEvery: number;
  readonly clock: Clock;
  leaseId: string | null = null;
  generation: bigint | null = null;
  /** The local deadline on `clock`; protected so that a test's broken variant can set it. */
  protected validUntil = 0;
  #lost: string | null = null;
  #abort = new AbortController();
  #progress: { deadline: number; why: string } | null = null;
  #renewer: Promise<void> | null = null;
  #stopped = true;
  #wake: (() => void) | null = null;

  constructor(options: OwnerOptions) {
    // Named prepared statements live in one server session: behind a transaction pooler the
    // next statement may run in another, and fail.
    if (options.sql.options.prepare) {
      throw new TypeError("pgfence: the Owner needs a postgres.js client with prepare: false");
    }
    this.sql = options.sql;
    this.resource = options.resource;
    this.owner = options.owner ?? `owner-${crypto.randomUUID().slice(0, 8)}`;
    this.ttl = options.ttl ?? 30;
    this.renewEvery = options.renewEvery ?? this.ttl / 3;
    this.clock = options.clock ?? monotonic;
  }

  /** Why the lease is no longer trusted (refused, released, a deadline), or null. */
  get lost(): string | null {
    return this.#lost;
  }

  /** Aborts when the lease is given up or found lost; a new one with each `acquire`. */
  get signal(): AbortSignal {
    return this.#abort.signal;
  }

  /** The local deadline, on `clock`: past it, this owner trusts its lease no longer. */
  get deadline(): number {
    return this.validUntil;
  }

  get valid(): boolean {
    return this.leaseId !== null && this.#lost === null && this.clock() < this.validUntil;
  }

  /** Throws LeaseLost unless `valid`. */
  check(): void {
    if (!this.valid) {
      throw new LeaseLost(this.#lost ?? `no lease on ${this.resource} (expired locally)`);
    }
  }

  /** Stops trusting the lease (the first reason is kept) and aborts `signal`. */
  markLost(why: string): void {
    if (this.#lost !== null) return;
    this.#lost = why;
    this.#abort.abort(new LeaseLost(why));
  }

  /**
   * Takes the lease if nobody holds it and starts the renewer; false while another owns it.
   * Throws ResourceDisabled (PF003) for a paused resource (exit cleanly) and ResourceUnknown
   * (PF002). One lease per Owner at a time: `release` the last one first.
   */
  async acquire(invocationId: string | null = null): Promise<boolean> {
    if (this.#renewer !== null) {
      throw new Error("pgfence: this Owner holds a lease; release it first");
    }
    const sent = this.clock();
    const [row] = await query(
      this.sql`select lease_id, generation from pgfence.acquire(${this.resource}, ${this.owner},
                 make_interval(secs => ${this.ttl}), ${invocationId}::uuid)`,
    );
    if (!row || row.lease_id === null) return false;
    this.leaseId = row.lease_id as string;
    this.generation = BigInt(row.generation as string);
    this.#lost = null;
    this.#abort = new AbortController();
    this.validUntil = sent + this.ttl;
    this.#progress = null;
    this.#stopped = false;
    this.#renewer = this.#renewLoop();
    return true;
  }

  /** Sends one renewal and returns the state it answered (active or draining). */
  protected async sendRenew(): Promise<string> {
    const [row] = await query(
      this.sql`select state
                 from pgfence.renew(${this.leaseId}::uuid, make_interval(secs => ${this.ttl}))`,
    );
    return row ? String(row.state) : "active";
  }

  /** One renewal; the new local deadline counts from when it was sent. */
  async renewOnce(): Promise<string> {
    const sent = this.clock();
    let state: string;
    try {
      state = await this.sendRenew();
    } catch (e) {
      if (e instanceof LeaseNotCurrent) this.markLost(`renewal refused: ${e.message}`);
      throw e;
    }
    this.validUntil = Math.max(this.validUntil, sent + this.ttl);
    return state;
  }

  /**
   * Ties renewal to progress: the renewer renews only until `deadline` (on `clock`); null lifts
   * the limit. If the deadline passes first, the renewer stops for good, drains the lease so
   * that a successor is admitted at once, and marks it lost (`why`): whoever set the deadline
   * is not making progress, and must not keep the resource by proxy. Nothing is cancelled but
   * `signal`: the late holder runs on, its fences are refused, and the database judges what it
   * reports (I5).
   */
  renewUntil(deadline: number | null, why = "a progress deadline"): void {
    this.#progress = deadline === null ? null : { deadline, why };
    this.#wake?.();
  }

  async #renewLoop(): Promise<void> {
    // The renewal cadence is real time; a progress deadline is judged on `clock`.
    let next = monotonic() + this.renewEvery;
    while (!this.#stopped) {
      const progress = this.#progress;
      let wait = next - monotonic();
      if (progress !== null) wait = Math.min(wait, progress.deadline - this.clock());
      if (wait > 0) {
        await this.#sleep(wait); // then read the state again: a wake-up changes it
        continue;
      }
      if (progress !== null && this.clock() >= progress.deadline) {
        // Checked before every renewal: none is sent for a holder past its deadline.
        await this.#abandon(progress.why);
        break;
      }
      next = monotonic() + this.renewEvery;
      try {
        await this.renewOnce();
      } catch {
        // A transient failure only costs time: the local deadline decides. A refusal (PF001)
        // has marked the lease lost and ends the loop.
        if (this.#lost !== null) break;
      }
    }
  }

  #sleep(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer); // a woken sleep leaves no timer behind (Deno's test sanitizer)
        this.#wake = null;
        resolve();
      };
      const timer = setTimeout(done, seconds * 1000);
      this.#wake = done;
    });
  }

  /**
   * Past a progress deadline: stop trusting the lease, and drain it (not release: the holder
   * may still hold tasks, and monitoring should show a draining lease, not an ended one). If
   * the drain fails, the unrenewed lease expires within its ttl anyway.
   */
  async #abandon(why: string): Promise<void> {
    this.markLost(`renewal stopped: ${why}`);
    try {
      await ignoreNotCurrent(this.sql`select pgfence.drain(${this.leaseId}::uuid)`);
    } catch {
      // see above: expiry covers it
    }
  }

  /**
   * The guard inside the caller's own transaction (`sql.begin`), before the writes it protects;
   * returns the lease's generation, to stamp on rows. Throws LeaseLost, and stops trusting the
   * lease, when the database refuses it (PF001). A pgflow or pgmq worker fences its own
   * transactions with it.
   */
  async fence(tx: TransactionSql): Promise<bigint> {
    this.check();
    try {
      const [row] = await query(tx`select pgfence.fence(${this.leaseId}::uuid) as generation`);
      return BigInt(row.generation as string);
    } catch (e) {
      throw this.#refused(e);
    }
  }

  /**
   * A transaction that is the owner's only if fence() passes in it (I2): `fn` gets it and the
   * generation to stamp on rows; `fn`'s result.
   */
  async fenced<T>(fn: (tx: TransactionSql, generation: bigint) => Promise<T>): Promise<T> {
    this.check();
    let result: T | undefined;
    try {
      await this.sql.begin(async (tx) => {
        result = await fn(tx, await this.fence(tx));
      });
    } catch (e) {
      throw this.#refused(e);
    }
    return result as T;
  }

  #refused(e: unknown): unknown {
    const error = pgfenceError(e);
    if (error instanceof LeaseNotCurrent || error instanceof UnfencedWrite) {
      this.markLost(`fence refused: ${error.message}`);
      return new LeaseLost(this.#lost ?? error.message, { cause: error });
    }
    return error;
  }

  /** Stops claiming; the resource is free for a successor at once. */
  async drain(): Promise<void> {
    if (this.leaseId !== null && this.#lost === null) {
      await ignoreNotCurrent(this.sql`select pgfence.drain(${this.leaseId}::uuid)`);
    }
  }

  /** Stops the renewer, then gives the lease up (a lease already ended is no error). */
  async release(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#renewer;
    this.#renewer = null;
    if (this.leaseId !== null) {
      await ignoreNotCurrent(this.sql`select pgfence.release(${this.leaseId}::uuid)`);
    }
    this.markLost("released");
  }
}

/** Awaits a query; a database error with a pgfence SQLSTATE comes back typed. */
async function query(pending: postgres.PendingQuery<postgres.Row[]>): Promise<postgres.Row[]> {
  try {
    return await pending;
  } catch (e) {
    throw pgfenceError(e);
  }
}

async function ignoreNotCurrent(pending: postgres.PendingQuery<postgres.Row[]>): Promise<void> {
  try {
    await query(pending);
  } catch (e) {
    if (!(e instanceof LeaseNotCurrent)) throw e;
  }
}

// --- Worker -------------------------------------------------------------------------------

/** The database's answer to a complete or fail (I5). */
export type Verdict = "accepted" | "duplicate" | "stale";

/** One claimed task: the attempt id is what its result is reported with. */
export interface Task {
  taskId: bigint;
  attemptId: string;
  attempt: number;
  payload: unknown;
}

export interface HandlerContext {
  task: Task;
  /** Aborts when the owner gives the lease up (a handler past its deadline, a refusal). */
  signal: AbortSignal;
  /** Keeps the task for `visibility` more seconds; null when the attempt no longer holds it. */
  extend(visibility: number): Promise<Date | null>;
}

/** Returns the task's result (JSON); throws to fail it. */
export type Handler = (payload: unknown, context: HandlerContext) => unknown;

export interface WorkerOptions {
  owner: Owner;
  queue: string;
  handler: Handler;
  /** Tasks per claim (default 1). */
  qty?: number;
  /** Seconds a claimed task stays the attempt's (default 30). */
  visibility?: number;
  /** Seconds to wait when the queue is empty (default 1). */
  idleWait?: number;
  /** Seconds per handler call on the owner's clock (default: visibility); Infinity: none. */
  handlerTimeout?: number;
}

/**
 * Claims and handles tasks of one queue while its Owner is valid.
 *
 * Each handler call runs under a deadline, `handlerTimeout` seconds on the owner's clock
 * (default: `visibility`, after which the task may be handed to someone else anyway). A
 * handler still running at its deadline makes the owner stop renewing and drain
 * (`Owner.renewUntil`), and aborts `context.signal`: a hung promise cannot keep the lease alive
 * forever. The worker then starts no other handler; when the hung one returns, its result is
 * reported (accepted if nobody re-claimed the task, stale otherwise) and the worker releases
 * and returns. `verdicts` counts the database's answers to the reports.
 */
export class Worker {
  readonly owner: Owner;
  readonly queue: string;
  readonly handler: Handler;
  readonly qty: number;
  readonly visibility: number;
  readonly idleWait: number;
  readonly handlerTimeout: number;
  handled = 0;
  readonly verdicts: Record<Verdict, number> = { accepted: 0, duplicate: 0, stale: 0 };
  #stop = false;
  #wake: (() => void) | null = null;

  constructor(options: WorkerOptions) {
    this.owner = options.owner;
    this.queue = options.queue;
    this.handler = options.handler;
    this.qty = options.qty ?? 1;
    this.visibility = options.visibility ?? 30;
    this.idleWait = options.idleWait ?? 1;
    this.handlerTimeout = options.handlerTimeout ?? this.visibility;
  }

  /** Drains: claim nothing more, finish the handler in hand, release. */
  stop(): void {
    this.#stop = true;
    this.#wake?.();
  }

  /** SIGTERM drains (see `stop`); returns a function that removes the listener. */
  installSigterm(): () => void {
    const listener = () => this.stop();
    Deno.addSignalListener("SIGTERM", listener);
    return () => Deno.removeSignalListener("SIGTERM", listener);
  }

  /**
   * The loop; drains and releases the lease when it ends, however it ends. It ends after
   * `maxTasks` handler calls, on `stop`, when ownership is in doubt, or (`untilIdle`) when the
   * queue has nothing to claim: the shape of an Edge Function invocation that must not idle.
   */
  async run(options: { maxTasks?: number; untilIdle?: boolean } = {}): Promise<void> {
    const { maxTasks, untilIdle = false } = options;
    try {
      while (!this.#stop && (maxTasks === undefined || this.handled < maxTasks)) {
        if (!this.owner.valid) break; // ownership in doubt: claim nothing more
        const tasks = await this.claim();
        if (tasks.length === 0) {
          const [{ requeued }] = await query(
            this.owner.sql`select pgfence.requeue_expired() as requeued`,
          );
          if (requeued === 0) {
            if (untilIdle) break;
            await this.#idle();
          }
          continue;
        }
        for (const task of tasks) {
          // After a handler ran past its deadline, start no other: the rest of the batch
          // returns to the queue when its visibility runs out.
          if (!this.owner.valid) break;
          await this.handle(task);
        }
      }
    } finally {
      await this.leave();
    }
  }

  /**
   * Release even when drain fails (the database away, a timeout): release is what stops the
   * renewer, which would otherwise keep the lease alive for a worker that has quit.
   */
  protected async leave(): Promise<void> {
    try {
      await this.owner.drain();
    } finally {
      await this.owner.release();
    }
  }

  protected async claim(): Promise<Task[]> {
    let rows: postgres.Row[];
    try {
      rows = await query(
        this.owner.sql`select task_id, attempt_id, attempt, payload
                         from pgfence.claim(${this.owner.leaseId}::uuid, ${this.queue}, ${this.qty},
                                            make_interval(secs => ${this.visibility}))`,
      );
    } catch (e) {
      if (e instanceof LeaseNotCurrent) {
        this.owner.markLost(`claim refused: ${e.message}`);
        return [];
      }
      throw e;
    }
    return rows.map((r) => ({
      taskId: BigInt(r.task_id as string),
      attemptId: r.attempt_id as string,
      attempt: r.attempt as number,
      payload: r.payload,
    }));
  }

  protected async handle(task: Task): Promise<void> {
    const owner = this.owner;
    if (this.handlerTimeout !== Infinity) {
      owner.renewUntil(
        owner.clock() + this.handlerTimeout,
        `a handler ran past its deadline (${this.handlerTimeout} s)`,
      );
    }
    const context: HandlerContext = {
      task,
      signal: owner.signal,
      extend: (visibility) => this.extend(task.attemptId, visibility),
    };
    let kind: "complete" | "fail" = "complete";
    let body: unknown;
    try {
      body = await this.handler(task.payload, context);
    } catch (e) {
      if (e instanceof LeaseLost) throw e;
      kind = "fail";
      body = { error: e instanceof Error ? e.message : String(e) };
    } finally {
      owner.renewUntil(null);
    }
    await this.report(kind, task.attemptId, body);
    this.handled += 1;
  }

  /** complete or fail; the database's verdict (I5) is counted in `verdicts`. */
  protected async report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict> {
    const sql = this.owner.sql;
    // sql.json: postgres.js serializes the value once (a string passed for jsonb would be
    // encoded again, as a JSON string). null and undefined report SQL NULL.
    const json = body === undefined || body === null ? null : sql.json(body as postgres.JSONValue);
    const [row] = await query(
      kind === "complete"
        ? sql`select pgfence.complete(${attemptId}::uuid, ${json}) as verdict`
        : sql`select pgfence.fail(${attemptId}::uuid, ${json}) as verdict`,
    );
    const verdict = row.verdict as Verdict;
    this.verdicts[verdict] += 1;
    return verdict;
  }

  protected async extend(attemptId: string, visibility: number): Promise<Date | null> {
    const [row] = await query(
      this.owner.sql`select pgfence.extend(${attemptId}::uuid, make_interval(secs => ${visibility}))
                       as visible_until`,
    );
    return (row.visible_until as Date | null) ?? null;
  }

  #idle(): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = null;
        resolve();
      };
      const timer = setTimeout(done, this.idleWait * 1000);
      this.#wake = done;
    });
  }
}

/**
 * A pgflow worker on pgfence: pgflow's worker protocol (read the flow's queue, start its tasks,
 * complete or fail them) through pgfence's pgflow layer (`pgfence_pgflow`), under an Owner's
 * lease on the worker function's resource. See docs/pgflow.md.
 *
 * A drop-in for pgflow's EdgeWorker: it runs a flow defined with `@pgflow/dsl` (its step
 * handlers get the same input, the run's input and their dependencies' outputs, or one item of
 * a map step's array, and an EdgeWorker-shaped context), started in one line:
 *
 * ```ts
 * FlowWorker.start(MyFlow, { sql: connect(Deno.env.get("DATABASE_URL")!), resource: "my-fn" });
 * ```
 *
 * The database does the fencing: `pgfence_pgflow.start_tasks` reads and starts only under the
 * current lease, in one statement, and `complete_task` / `fail_task` answer `accepted`,
 * `duplicate` or `stale` by the attempt that holds the task (I5). This class only stops
 * starting as soon as ownership is in doubt, always drains and releases, and, refused, waits
 * with capped, jittered backoff before it asks again: it never spins.
 *
 * @module
 */
// What this module's public names refer to, so that its reference is complete on its own.
export { Owner } from "./mod.ts";
export type {
  Clock,
  OwnerOptions,
  PendingQuery,
  QueryOptions,
  RetryOptions,
  Row,
  Sql,
  Step,
  TransactionSql,
  Verdict,
} from "./mod.ts";
import type postgres from "postgres";
import {
  ConnectionLost,
  LeaseLost,
  LeaseNotCurrent,
  Owner,
  type OwnerOptions,
  ResourceDisabled,
  type Row,
  UnfencedWrite,
  type Verdict,
} from "./mod.ts";

/** One started step task: the attempt id is what its result is reported with. */
export interface StepTask {
  /** This attempt's id (a capability: never log it). */
  attemptId: string;
  /** The run's id. */
  runId: string;
  /** The step's slug. */
  stepSlug: string;
  /** The task's index within its step (a map step's item). */
  taskIndex: number;
  /** pgflow's input: `{ run: <the run's input>, <dependency>: <its output>, ... }`, or one
   * item of the array a map step maps. */
  input: unknown;
  /** The id of the task's message in the flow's queue. */
  msgId: bigint;
}

/**
 * What a step handler gets beside its input: the fields of pgflow's EdgeWorker context that a
 * fenced worker can give (`env`, `shutdownSignal`, `stepTask`, `rawMessage`, `workerConfig`),
 * and this worker's own (`task`, `signal`).
 */
export interface StepContext {
  /** The task, with its attempt id. */
  task: StepTask;
  /** Aborts when the owner gives the lease up (a handler past its deadline, a refusal). */
  signal: AbortSignal;
  /** EdgeWorker's: the environment (Deno.env's variables where readable). */
  env: Record<string, string | undefined>;
  /** EdgeWorker's: aborts when the worker stops or its lease is given up. */
  shutdownSignal: AbortSignal;
  /** EdgeWorker's `stepTask` record. */
  stepTask: {
    flow_slug: string;
    run_id: string;
    step_slug: string;
    task_index: number;
    input: unknown;
    msg_id: number;
  };
  /** EdgeWorker's `rawMessage`, as far as the start returns it: the message's id and body. */
  rawMessage: {
    msg_id: number;
    message: { flow_slug: string; run_id: string; step_slug: string; task_index: number };
  };
  /** EdgeWorker's `workerConfig`, from this worker's settings. */
  workerConfig: Readonly<{
    maxConcurrent: number;
    maxPollSeconds: number;
    pollIntervalMs: number;
    batchSize: number;
    visibilityTimeout: number;
  }>;
}

/** Returns the step's output (JSON); throws to fail the task (pgflow retries it or fails it). */
export type StepHandler = (input: unknown, context: StepContext) => unknown;

/**
 * The part of a `@pgflow/dsl` Flow the worker reads: its slug, its steps in order, its and
 * their `timeout`, and each step's handler (`getStepDefinition`). Any Flow of the DSL fits.
 */
export interface FlowDefinition {
  /** The flow's slug (its queue's name). */
  readonly slug: string;
  /** Its step slugs, in the order they were added. */
  readonly stepOrder: readonly string[];
  /** Its options; `timeout` (seconds) is every step's default. */
  readonly options: { readonly timeout?: number };
}

/** A step of a DSL flow as the worker reads it. */
interface StepDefinitionLike {
  handler: (input: never, context: never) => unknown;
  options: { timeout?: number };
}

/** pgflow's default step timeout (seconds) when neither step nor flow sets one. */
const PGFLOW_TIMEOUT = 60;

/** How a refused worker waits before it asks again: capped exponential backoff, full jitter. */
export interface RefusalBackoff {
  /** Seconds: the first wait's ceiling (default 1). */
  base?: number;
  /** Seconds: the largest ceiling (default 30). */
  cap?: number;
  /** The jitter's source, in [0, 1) (default Math.random). */
  random?: () => number;
}

/** The settings of a `FlowWorker`. */
export interface FlowWorkerOptions {
  /** The Owner whose lease the tasks are started under. */
  owner: Owner;
  /** A flow defined with `@pgflow/dsl`: its slug, steps, handlers and timeouts. */
  flow?: FlowDefinition;
  /** Without `flow`: the flow's slug; pgflow queues its tasks on the queue of the same name. */
  flowSlug?: string;
  /** Without `flow`: one handler per step slug. */
  handlers?: Record<string, StepHandler>;
  /** Messages per start (default 1). */
  qty?: number;
  /** Seconds a read message stays hidden until the start sets the step's timeout + 2 s
   * (default 2). */
  visibility?: number;
  /** Seconds to wait when the queue is empty (default 1). */
  idleWait?: number;
  /** Seconds per handler call on the owner's clock (default: the step's timeout, else the
   * flow's, else pgflow's 60). */
  handlerTimeout?: number;
  /** The backoff after a refusal (see `supervise`). */
  backoff?: RefusalBackoff;
  /** The handlers' `context.env` (default: Deno.env's variables, where readable). */
  env?: Record<string, string | undefined>;
}

/** What `FlowWorker.start` needs: the Owner's settings and the worker's (without `owner`). */
export type FlowWorkerStartOptions =
  & Omit<OwnerOptions, "resource">
  & Omit<FlowWorkerOptions, "owner" | "flow" | "flowSlug" | "handlers">
  & {
    /** The worker function's resource. */
    resource: string;
    /** An invocation id of `pgfence.request_start` (the startup handshake): then the worker
     * acquires once, with it, and ends when that term ends. */
    invocationId?: string | null;
  };

function readEnv(): Record<string, string | undefined> {
  try {
    return Deno.env.toObject();
  } catch {
    return {}; // no --allow-env: handlers see none
  }
}

/**
 * Starts and handles the tasks of one pgflow flow while its Owner is valid; drains and
 * releases the lease when `run` ends, however it ends. `verdicts` counts the database's
 * answers to the results it reported. `supervise` (or `FlowWorker.start`) keeps a worker
 * running across leases, backing off after every refusal.
 */
export class FlowWorker {
  /** The owner of the lease. */
  readonly owner: Owner;
  /** The flow's slug (and queue). */
  readonly flowSlug: string;
  /** The handler of each step. */
  readonly handlers: Record<string, StepHandler>;
  /** Messages per start. */
  readonly qty: number;
  /** Seconds a read message stays hidden before the start sets its own. */
  readonly visibility: number;
  /** Seconds to wait when the queue is empty. */
  readonly idleWait: number;
  /** The backoff after a refusal. */
  readonly backoff: Readonly<Required<RefusalBackoff>>;
  /** Handler calls so far. */
  handled = 0;
  /** Refusals so far: acquires refused or not granted, and terms ended by a refusal. */
  refusals = 0;
  /** The database's answers to the reports. */
  readonly verdicts: Record<Verdict, number> = { accepted: 0, duplicate: 0, stale: 0 };
  /** Resolves when `supervise` (started by `FlowWorker.start`) ends. */
  done: Promise<void> = Promise.resolve();
  readonly #timeouts: Record<string, number>;
  readonly #env: Record<string, string | undefined>;
  #stop = false;
  #stopping = new AbortController();
  #wake: (() => void) | null = null;

  /** A worker of `options.flow` (or `flowSlug` and `handlers`) under `options.owner`. */
  constructor(options: FlowWorkerOptions) {
    this.owner = options.owner;
    const flow = options.flow;
    if (flow !== undefined) {
      this.flowSlug = flow.slug;
      this.handlers = {};
      this.#timeouts = {};
      const lookup = flow as unknown as { getStepDefinition(slug: string): StepDefinitionLike };
      for (const slug of flow.stepOrder) {
        const step = lookup.getStepDefinition(slug);
        this.handlers[slug] = step.handler as unknown as StepHandler;
        this.#timeouts[slug] = options.handlerTimeout ?? step.options.timeout ??
          flow.options.timeout ?? PGFLOW_TIMEOUT;
      }
    } else {
      if (options.flowSlug === undefined || options.handlers === undefined) {
        throw new TypeError("pgfence: FlowWorker needs `flow`, or `flowSlug` and `handlers`");
      }
      this.flowSlug = options.flowSlug;
      this.handlers = options.handlers;
      this.#timeouts = {};
      for (const slug of Object.keys(this.handlers)) {
        this.#timeouts[slug] = options.handlerTimeout ?? PGFLOW_TIMEOUT;
      }
    }
    this.qty = options.qty ?? 1;
    this.visibility = options.visibility ?? 2;
    this.idleWait = options.idleWait ?? 1;
    this.backoff = Object.freeze({
      base: options.backoff?.base ?? 1,
      cap: options.backoff?.cap ?? 30,
      random: options.backoff?.random ?? Math.random,
    });
    this.#env = options.env ?? readEnv();
  }

  /**
   * The one-line start, as pgflow's `EdgeWorker.start(flow)`: an Owner on `options.resource`
   * and a worker of `flow`, supervised (`supervise`) until `stop`; `done` resolves then.
   */
  static start(flow: FlowDefinition, options: FlowWorkerStartOptions): FlowWorker {
    const { invocationId = null, qty, visibility, idleWait, handlerTimeout, backoff, env } =
      options;
    const owner = new Owner({
      sql: options.sql,
      resource: options.resource,
      owner: options.owner,
      ttl: options.ttl,
      renewEvery: options.renewEvery,
      clock: options.clock,
      retry: options.retry,
    });
    const worker = new FlowWorker({
      owner,
      flow,
      qty,
      visibility,
      idleWait,
      handlerTimeout,
      backoff,
      env,
    });
    worker.done = worker.supervise({ invocationId });
    return worker;
  }

  /** Seconds per handler call of a step. */
  handlerTimeout(stepSlug: string): number {
    return this.#timeouts[stepSlug] ?? PGFLOW_TIMEOUT;
  }

  /** Drains: start nothing more, finish the handler in hand, release; `supervise` ends. */
  stop(): void {
    this.#stop = true;
    this.#stopping.abort();
    this.#wake?.();
  }

  /** SIGTERM drains (see `stop`); returns a function that removes the listener. */
  installSigterm(): () => void {
    const listener = () => this.stop();
    Deno.addSignalListener("SIGTERM", listener);
    return () => Deno.removeSignalListener("SIGTERM", listener);
  }

  /**
   * Keeps the worker running across leases until `stop`: acquire, `run`, and again. A refusal
   * (the lease held by another, the resource disabled (PF003) in an update window, a start
   * refused (PF001, PF007) because the lease was superseded, drained or expired) makes it wait
   * before it asks again, `backoff.random() * min(cap, base * 2^n)` seconds after the n-th
   * refusal in a row (at least 10 ms); a term that handled a task resets n. With an
   * `invocationId` (the startup handshake) it acquires once, with that id, and ends with that
   * term: a new term needs a new invocation. A resource that does not exist (PF002) throws.
   */
  async supervise(options: { invocationId?: string | null } = {}): Promise<void> {
    const invocationId = options.invocationId ?? null;
    let row = 0; // refusals in a row
    while (!this.#stop) {
      let acquired = false;
      try {
        acquired = await this.owner.acquire(invocationId);
      } catch (e) {
        if (!(e instanceof ResourceDisabled || e instanceof ConnectionLost)) throw e;
      }
      if (acquired) {
        const before = this.handled;
        try {
          await this.run();
        } catch (e) {
          if (!(e instanceof LeaseLost)) throw e;
        }
        if (this.handled > before) row = 0;
        if (this.#stop || invocationId !== null) return;
        if (this.handled > before) continue;
      }
      if (invocationId !== null) return; // the invocation was refused: a new one is needed
      this.refusals += 1;
      await this.pause(this.refusalWait(row++));
    }
  }

  /** Seconds to wait after `n` refusals in a row (full jitter, at least 10 ms). */
  refusalWait(n: number): number {
    const ceiling = Math.min(this.backoff.cap, this.backoff.base * 2 ** n);
    return Math.max(0.01, this.backoff.random() * ceiling);
  }

  /** Waits `seconds` of real time, or less if `stop` is called. */
  protected pause(seconds: number): Promise<void> {
    return new Promise((resolve) => {
      const signal = this.#stopping.signal;
      if (signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, seconds * 1000);
      signal.addEventListener("abort", done);
    });
  }

  /**
   * One term: starts and handles tasks under the Owner's current lease. It ends after
   * `maxTasks` handler calls, on `stop`, once the lease is known lost (a start refused), or
   * (`untilIdle`) when the flow's queue has nothing to start: the shape of an Edge Function
   * invocation that must not idle. While the lease is in doubt (a lost connection) it starts
   * nothing and waits for the renewer's verdict (`Owner.trust`). Drains and releases at the end.
   */
  async run(options: { maxTasks?: number; untilIdle?: boolean } = {}): Promise<void> {
    const { maxTasks, untilIdle = false } = options;
    try {
      while (!this.#stop && (maxTasks === undefined || this.handled < maxTasks)) {
        if (!(await this.#trusted())) break; // ownership lost: start nothing more
        const tasks = await this.start();
        if (tasks === null) continue; // the start's answer was lost: its tasks come back
        if (tasks.length === 0) {
          if (!this.owner.valid) break; // refused
          if (untilIdle) break;
          await this.#idle();
          continue;
        }
        for (const task of tasks) {
          // The rest come back when their visibility runs out.
          if (this.#stop || !(await this.#trusted())) break;
          await this.handle(task);
        }
      }
    } finally {
      try {
        await this.owner.drain();
      } finally {
        await this.owner.release(); // stops the renewer even when the drain failed
      }
    }
  }

  async #trusted(): Promise<boolean> {
    return this.owner.valid || await this.owner.trust(this.#stopping.signal);
  }

  /**
   * One fenced read and start, in one statement: nothing starts unless the lease is current.
   * Not resent after a lost connection (null then: what it started comes back to a new
   * attempt); a refusal (PF001, PF007) marks the lease lost and returns no task.
   */
  protected async start(): Promise<StepTask[] | null> {
    const owner = this.owner;
    let rows: Row[];
    try {
      rows = await owner.query(
        "claim",
        (sql) =>
          sql`select attempt_id, run_id, step_slug, task_index, input, msg_id
                from pgfence_pgflow.start_tasks(${owner.leaseId}::uuid,
                       ${this.flowSlug}, ${this.flowSlug},
                       make_interval(secs => ${this.visibility}), ${this.qty})`,
      );
    } catch (e) {
      if (e instanceof LeaseNotCurrent || e instanceof UnfencedWrite) {
        owner.markLost(`start under ${owner.name} refused: ${e.message}`);
        return [];
      }
      if (e instanceof ConnectionLost) return null;
      throw e;
    }
    return rows.map((r) => ({
      attemptId: r.attempt_id as string,
      runId: r.run_id as string,
      stepSlug: r.step_slug as string,
      taskIndex: r.task_index as number,
      input: r.input,
      msgId: BigInt(r.msg_id as string),
    }));
  }

  /** The context a step's handler gets (EdgeWorker's shape, see `StepContext`). */
  protected context(task: StepTask): StepContext {
    const msgId = Number(task.msgId);
    return {
      task,
      signal: this.owner.signal,
      env: this.#env,
      shutdownSignal: AbortSignal.any([this.owner.signal, this.#stopping.signal]),
      stepTask: {
        flow_slug: this.flowSlug,
        run_id: task.runId,
        step_slug: task.stepSlug,
        task_index: task.taskIndex,
        input: task.input,
        msg_id: msgId,
      },
      rawMessage: {
        msg_id: msgId,
        message: {
          flow_slug: this.flowSlug,
          run_id: task.runId,
          step_slug: task.stepSlug,
          task_index: task.taskIndex,
        },
      },
      workerConfig: Object.freeze({
        maxConcurrent: 1,
        maxPollSeconds: this.idleWait,
        pollIntervalMs: this.idleWait * 1000,
        batchSize: this.qty,
        visibilityTimeout: this.visibility,
      }),
    };
  }

  /** One task: the handler under its step's deadline, then the report. */
  protected async handle(task: StepTask): Promise<void> {
    const owner = this.owner;
    const timeout = this.handlerTimeout(task.stepSlug);
    // A hung handler must not keep the lease alive by proxy: past its deadline the owner stops
    // renewing and drains, and its late result is judged like any other (I5).
    owner.renewUntil(
      owner.clock() + timeout,
      `a step handler ran past its deadline (${timeout} s)`,
    );
    let kind: "complete" | "fail" = "complete";
    let body: unknown;
    try {
      const handler = this.handlers[task.stepSlug];
      if (handler === undefined) throw new Error(`no handler for step ${task.stepSlug}`);
      body = await handler(task.input, this.context(task));
    } catch (e) {
      if (e instanceof LeaseLost) throw e; // the handler saw the lease go: nothing to report
      kind = "fail";
      body = e instanceof Error ? e.message : String(e);
    } finally {
      owner.renewUntil(null);
    }
    await this.report(kind, task.attemptId, body);
    this.handled += 1;
  }

  /**
   * complete_task or fail_task, through `Owner.query`: 40P01 and 40001 are tried again, and a
   * lost connection is sent again with the same attempt id (a second copy answers `duplicate`).
   * The verdict is counted in `verdicts`.
   */
  protected async report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict> {
    const [row] = await this.owner.query(kind, (sql) => {
      // sql.json: postgres.js serializes the value once; null and undefined report SQL NULL.
      const json = body === undefined || body === null
        ? null
        : sql.json(body as postgres.JSONValue);
      return kind === "complete"
        ? sql`select pgfence_pgflow.complete_task(${attemptId}::uuid, ${json}) as verdict`
        : sql`select pgfence_pgflow.fail_task(${attemptId}::uuid, ${String(body)}) as verdict`;
    }, { resend: true });
    const verdict = row.verdict as Verdict;
    this.verdicts[verdict] += 1;
    return verdict;
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

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
 * current lease, in one statement, `set_vt` keeps a task's message only for the attempt that
 * holds it, and `complete_task` / `fail_task` answer `accepted`, `duplicate` or `stale` by that
 * attempt (I5). The loop is the client's one (`WorkerLoop`, mod.ts): it stops starting as soon
 * as ownership is in doubt, starts no handler whose task's visibility would run out first,
 * always drains and releases, and, refused, waits with capped, jittered backoff before it asks
 * again: it never spins.
 *
 * @module
 */
// What this module's public names refer to, so that its reference is complete on its own.
export { edgeRuntime, Owner, processRuntime, runtime, WorkerLoop } from "./mod.ts";
export type {
  Attempt,
  Clock,
  HandlerContext,
  LoopOptions,
  OwnerOptions,
  PendingQuery,
  Platform,
  QueryOptions,
  RefusalBackoff,
  RetryOptions,
  Row,
  RunOptions,
  Sql,
  Step,
  SuperviseOptions,
  TransactionSql,
  Verdict,
} from "./mod.ts";
import type postgres from "postgres";
import {
  type Attempt,
  type HandlerContext,
  type LoopOptions,
  Owner,
  type OwnerOptions,
  type PendingQuery,
  type Row,
  runtime,
  type Sql,
  WorkerLoop,
} from "./mod.ts";

/** One started step task: the attempt id is what its result is reported with. */
export interface StepTask extends Attempt {
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
 * and this worker's own (`task`, `signal`, `deadline`, `extend`).
 */
export interface StepContext extends HandlerContext<StepTask> {
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
/** Seconds a start hides a task's message beyond its step's timeout (pgflow's rule, which
 * `pgfence_pgflow.start_tasks` applies). */
const START_MARGIN = 2;

/** The settings of a `FlowWorker`. */
export interface FlowWorkerOptions extends LoopOptions {
  /** A flow defined with `@pgflow/dsl`: its slug, steps, handlers and timeouts. */
  flow?: FlowDefinition;
  /** Without `flow`: the flow's slug; pgflow queues its tasks on the queue of the same name. */
  flowSlug?: string;
  /** Without `flow`: one handler per step slug. */
  handlers?: Record<string, StepHandler>;
  /** Seconds a read message stays hidden until the start sets the step's timeout + 2 s
   * (default 2). */
  visibility?: number;
  /** Seconds per handler call on the owner's clock (default: the step's timeout, from the DSL
   * flow, else from the database, where pgflow keeps the step's and the flow's). */
  handlerTimeout?: number;
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
 * Starts and handles the tasks of one pgflow flow while its Owner is valid, on the client's one
 * worker loop (`WorkerLoop`: visibility before each handler, deadlines, drain, hand-back,
 * release, `supervise` across leases with refusal backoff, `installShutdown`). `verdicts`
 * counts the database's answers to the results it reported.
 *
 * A started task is its attempt's for its step's timeout (the start hides its message for the
 * timeout + 2 s): that is the visibility its handler's deadline must fit in. The worker reads
 * the steps' timeouts from the database (`pgflow.steps`, `pgflow.flows`), so it needs SELECT on
 * them, as pgflow's own worker role has. Before each later task of a batch it extends the
 * task's message (`pgfence_pgflow.set_vt`) when what is left would not cover the handler's
 * deadline, and skips the task when its attempt no longer holds it.
 */
export class FlowWorker extends WorkerLoop<StepTask> {
  /** The flow's slug (and queue). */
  readonly flowSlug: string;
  /** The handler of each step. */
  readonly handlers: Record<string, StepHandler>;
  readonly #dsl: Record<string, number>;
  readonly #handlerTimeout: number | undefined;
  readonly #env: Record<string, string | undefined>;
  /** The steps' timeouts in the database (what the start hides a task's message for, less 2 s). */
  #timeouts = new Map<string, number>();

  /** A worker of `options.flow` (or `flowSlug` and `handlers`) under `options.owner`. */
  constructor(options: FlowWorkerOptions) {
    super({ ...options, visibility: options.visibility ?? 2 });
    const flow = options.flow;
    this.#dsl = {};
    if (flow !== undefined) {
      this.flowSlug = flow.slug;
      this.handlers = {};
      const lookup = flow as unknown as { getStepDefinition(slug: string): StepDefinitionLike };
      for (const slug of flow.stepOrder) {
        const step = lookup.getStepDefinition(slug);
        this.handlers[slug] = step.handler as unknown as StepHandler;
        this.#dsl[slug] = step.options.timeout ?? flow.options.timeout ?? PGFLOW_TIMEOUT;
      }
    } else {
      if (options.flowSlug === undefined || options.handlers === undefined) {
        throw new TypeError("pgfence: FlowWorker needs `flow`, or `flowSlug` and `handlers`");
      }
      this.flowSlug = options.flowSlug;
      this.handlers = options.handlers;
    }
    this.#handlerTimeout = options.handlerTimeout;
    this.#env = options.env ?? readEnv();
  }

  /**
   * The one-line start, as pgflow's `EdgeWorker.start(flow)`: an Owner on `options.resource`
   * and a worker of `flow`, supervised (`supervise`) until `stop` or the platform's shutdown
   * (`installShutdown`: `beforeunload` in the Edge Runtime, SIGTERM and SIGINT in a process);
   * `done` resolves then, and the Edge Runtime is kept alive until it does.
   */
  static start(flow: FlowDefinition, options: FlowWorkerStartOptions): FlowWorker {
    const { invocationId = null, resource, sql, owner: name, ttl, renewEvery, clock, retry } =
      options;
    const owner = new Owner({ sql, resource, owner: name, ttl, renewEvery, clock, retry });
    const worker = new FlowWorker({ ...options, owner, flow });
    const platform = runtime();
    const remove = worker.installShutdown(platform);
    worker.done = worker.supervise({ invocationId }).finally(remove);
    platform.keepAlive(worker.done);
    return worker;
  }

  /**
   * Seconds per handler call of a step (a task's or a slug): `handlerTimeout` if set, else the
   * DSL step's timeout, else the step's timeout in the database (known once a task of the step
   * was started), else pgflow's 60.
   */
  handlerTimeout(task: StepTask | string): number {
    const slug = typeof task === "string" ? task : task.stepSlug;
    return this.#handlerTimeout ?? this.#dsl[slug] ?? this.#timeouts.get(slug) ?? PGFLOW_TIMEOUT;
  }

  /** The start hid the task's message for its step's timeout + 2 s (the read's `visibility`
   * where the timeout is unknown). */
  protected override granted(task: StepTask): number {
    const timeout = this.#timeouts.get(task.stepSlug);
    return timeout === undefined ? this.visibility : timeout + START_MARGIN;
  }

  /**
   * One fenced read and start, in one statement: nothing starts unless the lease is current.
   * Not resent after a lost connection (what it started comes back to a new attempt); a
   * refusal (PF001, PF007) marks the lease lost.
   */
  protected claimStatement(sql: Sql): PendingQuery {
    return sql`select attempt_id, run_id, step_slug, task_index, input, msg_id
                 from pgfence_pgflow.start_tasks(${this.owner.leaseId}::uuid,
                        ${this.flowSlug}, ${this.flowSlug},
                        make_interval(secs => ${this.visibility}), ${this.qty})`;
  }

  protected async claimed(rows: Row[], sent: number): Promise<StepTask[]> {
    const tasks = rows.map((r) => ({
      attemptId: r.attempt_id as string,
      runId: r.run_id as string,
      stepSlug: r.step_slug as string,
      taskIndex: r.task_index as number,
      input: r.input,
      msgId: BigInt(r.msg_id as string),
      visibleUntil: sent,
    }));
    if (tasks.some((task) => !this.#timeouts.has(task.stepSlug))) await this.#readTimeouts();
    for (const task of tasks) task.visibleUntil = sent + this.granted(task);
    return tasks;
  }

  /**
   * The flow's steps' timeouts as pgflow keeps them (the step's, else the flow's): what the
   * start hides a started task's message for (+ 2 s). Read again when a step is new to the
   * worker. Its answer lost, the tasks keep the read's `visibility` only: each is extended (or
   * skipped) before its handler starts.
   */
  async #readTimeouts(): Promise<void> {
    try {
      const rows = await this.owner.query(
        "claim",
        (sql) =>
          sql`select s.step_slug, coalesce(s.opt_timeout, f.opt_timeout) as timeout
                from pgflow.steps s join pgflow.flows f on f.flow_slug = s.flow_slug
               where s.flow_slug = ${this.flowSlug}`,
        { resend: true, until: this.owner.deadline },
      );
      this.#timeouts = new Map(rows.map((r) => [r.step_slug as string, Number(r.timeout)]));
    } catch {
      // See above: the tasks' own checks cover it.
    }
  }

  protected call(task: StepTask, context: HandlerContext<StepTask>): unknown {
    const handler = this.handlers[task.stepSlug];
    if (handler === undefined) throw new Error(`no handler for step ${task.stepSlug}`);
    return handler(task.input, this.context(task, context));
  }

  /** The context a step's handler gets (EdgeWorker's shape, see `StepContext`). */
  protected context(task: StepTask, base: HandlerContext<StepTask>): StepContext {
    const msgId = Number(task.msgId);
    return {
      ...base,
      env: this.#env,
      shutdownSignal: AbortSignal.any([this.owner.signal, this.stopping]),
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

  /** pgflow records a failure's message. */
  protected override failure(e: unknown): unknown {
    return e instanceof Error ? e.message : String(e);
  }

  /**
   * complete_task or fail_task: 40P01 and 40001 are tried again, and a lost connection is sent
   * again with the same attempt id (a second copy answers `duplicate`).
   */
  protected reportStatement(
    sql: Sql,
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): PendingQuery {
    if (kind === "fail") {
      return sql`select pgfence_pgflow.fail_task(${attemptId}::uuid, ${String(body)}) as verdict`;
    }
    // sql.json: postgres.js serializes the value once; null and undefined report SQL NULL.
    const output = body === undefined || body === null
      ? null
      : sql.json(body as postgres.JSONValue);
    return sql`select pgfence_pgflow.complete_task(${attemptId}::uuid, ${output}) as verdict`;
  }

  /** `pgfence_pgflow.set_vt`: null when the attempt no longer holds the task or its message. */
  protected extendStatement(sql: Sql, attemptId: string, visibility: number): PendingQuery {
    return sql`select pgfence_pgflow.set_vt(${attemptId}::uuid, make_interval(secs => ${visibility}))
                 as visible_until`;
  }
}

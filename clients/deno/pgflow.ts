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
  Task,
  TransactionSql,
  Verdict,
} from "./mod.ts";
import type postgres from "postgres";
import {
  type Attempt,
  connect,
  type HandlerContext,
  InvalidArgument,
  invocationOf,
  jsonResponse,
  type LoopOptions,
  Owner,
  type OwnerOptions,
  type PendingQuery,
  type Platform,
  ResourceDisabled,
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
 * fenced worker can give (`env`, `sql`, `shutdownSignal`, `flowInput`, `stepTask`, `rawMessage`,
 * `workerConfig`; not `supabase`: make that client yourself), and this worker's own (`task`,
 * `signal`, `deadline`, `extend`, `owner`).
 */
export interface StepContext extends HandlerContext<StepTask> {
  /** The Owner whose lease the task was started under: `owner.fenced(fn)` runs `fn` in a
   * transaction that fenced that lease (a handler of `FlowWorker.start` or `serve` has no other
   * way to reach it). */
  owner: Owner;
  /** EdgeWorker's: the environment (Deno.env's variables where readable). */
  env: Record<string, string | undefined>;
  /** EdgeWorker's: aborts when the worker stops or its lease is given up. */
  shutdownSignal: AbortSignal;
  /** EdgeWorker's `sql`: the worker's pool. Writes through it are not fenced: fence them with
   * `owner.fenced`, or make them idempotent by the task's key. */
  sql: Sql;
  /** EdgeWorker's (pgflow 0.14): the run's input, read from `pgflow.runs` when the task's
   * input did not carry it (a map task's). */
  readonly flowInput: Promise<unknown>;
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
/** The longest visibility the database grants (pgfence.check_interval): a day. */
const DAY = 86400;

/** The settings of a `FlowWorker`. */
export interface FlowWorkerOptions extends LoopOptions {
  /** A flow defined with `@pgflow/dsl`: its slug, steps, handlers and timeouts. */
  flow?: FlowDefinition;
  /** Without `flow`: the flow's slug; pgflow queues its tasks on the queue of the same name. */
  flowSlug?: string;
  /** Without `flow`: one handler per step slug. */
  handlers?: Record<string, StepHandler>;
  /** Seconds a read message stays hidden until the start sets the step's timeout + 2 s
   * (default 2); a batch (`qty` > 1) is held longer, for its handlers one after another
   * (`FlowWorker.hold`). */
  visibility?: number;
  /** Seconds per handler call on the owner's clock (default: the step's timeout, from the DSL
   * flow, else from the database, where pgflow keeps the step's and the flow's). */
  handlerTimeout?: number;
  /** The handlers' `context.env` (default: Deno.env's variables, where readable). */
  env?: Record<string, string | undefined>;
  /**
   * What a handler's `input` is: `with-run` (default; `FlowWorker.serve`'s is `pgflow`): the
   * run's input under `run` beside the dependencies' outputs, on every pgflow (pgflow 0.8's
   * shape); `pgflow`: what the pgflow in the database gives its own workers (from 0.14 a root
   * step gets the run's input itself, another step its dependencies' outputs only, the run's
   * input in `context.flowInput`). A map step's handler gets its item either way.
   */
  input?: "with-run" | "pgflow";
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
 * timeout + 2 s), and a batch's tasks for the batch's handlers one after another (`hold`: the
 * start hides each message for that when it is longer): that is the visibility its handler's
 * deadline must fit in. The worker reads the steps' timeouts from the database
 * (`pgflow.steps`, `pgflow.flows`), so it needs SELECT on them, as pgflow's own worker role
 * has. Before each later task of a batch it extends the task's message
 * (`pgfence_pgflow.set_vt`) only when what is left would not cover the handler's deadline (a
 * handler before it ran long), and skips the task when its attempt no longer holds it. A
 * batch's results go in one `pgfence_pgflow.complete_many`; a failure's `fail_task` at once.
 */
export class FlowWorker extends WorkerLoop<StepTask> {
  /** The flow's slug (and queue). */
  readonly flowSlug: string;
  /** The handler of each step. */
  readonly handlers: Record<string, StepHandler>;
  readonly #dsl: Record<string, number>;
  readonly #handlerTimeout: number | undefined;
  readonly #env: Record<string, string | undefined>;
  /** The flow's steps as the database has them: each one's timeout (what the start hides a
   * task's message for, less 2 s), whether it is a map step, and whether it has
   * dependencies; `flowInput`: whether this pgflow gives a task its dependencies' outputs
   * only (0.14's shape). */
  #steps = new Map<string, { timeout: number; map: boolean; root: boolean }>();
  #flowInput = false;
  readonly #input: "with-run" | "pgflow";

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
    this.#input = options.input ?? "with-run";
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
   * The drop-in entry, as pgflow's `EdgeWorker.start(flow)` in an Edge Function's `index.ts`:
   * serves the pings of `pgfence_pgflow.ensure_workers` (pgflow 0.14's, through the startup
   * handshake). Each ping is authenticated as pgflow's worker does (`Authorization: Bearer`
   * `PGFLOW_AUTH_SECRET`, else `SUPABASE_SERVICE_ROLE_KEY`; none on a local Supabase: 401);
   * a malformed body is refused (400), a ping without an invocation id, or while this
   * isolate's worker runs, too (409), with nothing acquired. A fresh invocation id acquires
   * the function's lease (409 when it is not the pending one, 503 while the resource is
   * paused); then, once per isolate, the function is tracked for `ensure_workers`
   * (`pgflow.track_worker_function`, pgflow 0.9 on) and the flow compiled or verified
   * (`ensureFlowCompiled`: 500 naming the fix when refused, and the lease released); then the
   * term runs (202) until the lease is lost or the platform shuts the isolate down
   * (`beforeunload`, SIGTERM, SIGINT: the task in hand gets `shutdownGrace`), and the worker's
   * `pgflow.workers` row is marked stopped (`pgfence_pgflow.mark_worker_stopped`). Every
   * answer is JSON; none carries a stack.
   */
  static serve(flow: FlowDefinition, options: ServeOptions = {}): FlowEndpoint {
    return serveFlow(flow, options);
  }

  /**
   * Seconds per handler call of a step (a task's or a slug): `handlerTimeout` if set, else the
   * DSL step's timeout, else the step's timeout in the database (known once a task of the step
   * was started), else pgflow's 60.
   */
  handlerTimeout(task: StepTask | string): number {
    const slug = typeof task === "string" ? task : task.stepSlug;
    return this.#handlerTimeout ?? this.#dsl[slug] ?? this.#steps.get(slug)?.timeout ??
      PGFLOW_TIMEOUT;
  }

  /**
   * Seconds the start hides a batch's messages for at least (its `vt`): the batch's handlers one
   * after another, each within its deadline (`qty` × the longest handler deadline of the flow's
   * steps known, at most a day), so that no later task of the batch needs an extend before it
   * starts. A batch of one keeps the read's `visibility`: its start gives the task its step's
   * timeout + 2 s, all its handler needs. The price of a batch is liveness: the tasks of a
   * worker that dies come back when its hold runs out.
   */
  get hold(): number {
    if (this.qty === 1) return this.visibility;
    // Before any step is known (no DSL flow, nothing started yet): `handlerTimeout`, else
    // pgflow's 60.
    const slugs = new Set(["", ...Object.keys(this.#dsl), ...this.#steps.keys()]);
    if (slugs.size > 1) slugs.delete("");
    const longest = Math.max(...[...slugs].map((slug) => this.handlerTimeout(slug)));
    return Math.max(this.visibility, Math.min(this.qty * longest, DAY));
  }

  /** A batch's first start knows the steps' timeouts it holds the batch for: read first when
   * neither a DSL flow nor a start has told them (the answer lost: pgflow's 60 s each). */
  protected override async claim(): Promise<StepTask[] | null> {
    if (this.qty > 1 && this.#steps.size === 0 && Object.keys(this.#dsl).length === 0) {
      await this.#readSteps();
    }
    return await super.claim();
  }

  /** The hold the last start asked for (`hold` may change once the steps are read). */
  #held = 2;

  /** The start hid the task's message for its step's timeout + 2 s, or the batch's hold when
   * longer (the hold alone where the timeout is unknown). */
  protected override granted(task: StepTask): number {
    const timeout = this.#steps.get(task.stepSlug)?.timeout;
    return Math.max(timeout === undefined ? 0 : timeout + START_MARGIN, this.#held);
  }

  /**
   * One fenced read and start, in one statement: nothing starts unless the lease is current.
   * Not resent after a lost connection (what it started comes back to a new attempt); a
   * refusal (PF001, PF007) marks the lease lost.
   */
  protected claimStatement(sql: Sql): PendingQuery {
    this.#held = this.hold;
    return sql`select attempt_id, run_id, step_slug, task_index, input, msg_id
                 from pgfence_pgflow.start_tasks(${this.owner.leaseId}::uuid,
                        ${this.flowSlug}, ${this.flowSlug},
                        make_interval(secs => ${this.#held}), ${this.qty})`;
  }

  /** The start's rows as tasks, each visible for its step's timeout + 2 s (or the batch's hold)
   * from when the start was sent; their inputs in the shape `input` asks for. */
  protected async claimed(rows: Row[], sent: number): Promise<StepTask[]> {
    const tasks: StepTask[] = rows.map((r) => ({
      attemptId: r.attempt_id as string,
      runId: r.run_id as string,
      stepSlug: r.step_slug as string,
      taskIndex: r.task_index as number,
      input: r.input,
      msgId: BigInt(r.msg_id as string),
      visibleUntil: sent,
    }));
    if (tasks.some((task) => !this.#steps.has(task.stepSlug))) await this.#readSteps();
    for (const task of tasks) {
      task.visibleUntil = sent + this.granted(task);
      this.#shape(task);
    }
    return tasks;
  }

  /**
   * The flow's steps as pgflow keeps them: each one's timeout (the step's, else the flow's),
   * what the start hides a started task's message for (+ 2 s); its type and dependencies (for
   * `input: "pgflow"`). Read again when a step is new to the worker. Its answer lost, the tasks
   * keep the read's `visibility` only: each is extended (or skipped) before its handler starts.
   */
  async #readSteps(): Promise<void> {
    try {
      const rows = await this.owner.query(
        "claim",
        (sql) =>
          sql`select s.step_slug, coalesce(s.opt_timeout, f.opt_timeout) as timeout,
                     s.step_type = 'map' as map,
                     not exists (select from pgflow.deps d
                                  where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug)
                       as root,
                     exists (select from pg_catalog.pg_attribute a
                              where a.attrelid = 'pgflow.step_task_record'::regclass
                                and a.attname = 'flow_input' and not a.attisdropped)
                       as flow_input
                from pgflow.steps s join pgflow.flows f on f.flow_slug = s.flow_slug
               where s.flow_slug = ${this.flowSlug}`,
        { resend: true, until: this.owner.deadline },
      );
      this.#steps = new Map(rows.map((r) => [r.step_slug as string, {
        timeout: Number(r.timeout),
        map: r.map as boolean,
        root: r.root as boolean,
      }]));
      this.#flowInput = rows.some((r) => r.flow_input as boolean);
    } catch {
      // See above: the tasks' own checks cover it.
    }
  }

  /** Run inputs of the tasks whose input carried it (see `#shape`). */
  #runInputs = new WeakMap<StepTask, unknown>();

  /**
   * `input: "pgflow"` on a pgflow that gives a task its dependencies' outputs only (0.14): the
   * layer's input (the run's under `run`, beside them) in that shape, the run's input kept for
   * `context.flowInput`. A root step's handler gets the run's input itself; a map step's its
   * item, as on every pgflow.
   */
  #shape(task: StepTask): void {
    const step = this.#steps.get(task.stepSlug);
    if (step === undefined || step.map) return;
    const { run, ...outputs } = task.input as { run?: unknown } & Record<string, unknown>;
    this.#runInputs.set(task, run);
    if (this.#input !== "pgflow" || !this.#flowInput) return;
    task.input = step.root ? run : outputs;
  }

  /** The step's handler, with the task's input and the EdgeWorker-shaped context. */
  protected call(task: StepTask, context: HandlerContext<StepTask>): unknown {
    const handler = this.handlers[task.stepSlug];
    if (handler === undefined) throw new Error(`no handler for step ${task.stepSlug}`);
    return handler(task.input, this.context(task, context));
  }

  /** The context a step's handler gets (EdgeWorker's shape, see `StepContext`). */
  protected context(task: StepTask, base: HandlerContext<StepTask>): StepContext {
    const msgId = Number(task.msgId);
    const runInputs = this.#runInputs;
    const sql = this.owner.sql;
    let flowInput: Promise<unknown> | undefined;
    return {
      ...base,
      get flowInput(): Promise<unknown> {
        flowInput ??= runInputs.has(task)
          ? Promise.resolve(runInputs.get(task))
          : sql`select input from pgflow.runs where run_id = ${task.runId}::uuid`.then((rows) =>
            rows[0]?.input
          );
        return flowInput;
      },
      env: this.#env,
      sql,
      owner: this.owner,
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

  /** `pgfence_pgflow.complete_many`: one row per result, `verdict`. The outputs go as one JSON
   * array (a handler's null or undefined as SQL NULL, as `complete_task` sends it). */
  protected override reportManyStatement(
    sql: Sql,
    results: { task: StepTask; body: unknown }[],
  ): PendingQuery {
    const ids = `{${results.map(({ task }) => task.attemptId).join(",")}}`;
    const outputs = results.map(({ body }) => body ?? null) as postgres.JSONValue;
    return sql`select outcome as verdict
                 from pgfence_pgflow.complete_many(${ids}::uuid[],
                        array(select nullif(r.value, 'null')
                                from jsonb_array_elements(${sql.json(outputs)}::jsonb)
                                     with ordinality r(value, n)
                               order by r.n))`;
  }

  /** `pgfence_pgflow.set_vt`: null when the attempt no longer holds the task or its message. */
  protected extendStatement(sql: Sql, attemptId: string, visibility: number): PendingQuery {
    return sql`select pgfence_pgflow.set_vt(${attemptId}::uuid, make_interval(secs => ${visibility}))
                 as visible_until`;
  }
}

// --- the drop-in entry: an Edge Function that ensure_workers starts ---------------------------

/** How the entry compiles or verifies the flow in the database (pgflow's `compilation`). */
export type Compilation = false | {
  /** When the database's flow differs: recompile it, deleting its runs (pgflow 0.14's
   * `allowDataLoss`; pgflow recompiles by itself on a local Supabase). Default false. */
  allowDataLoss?: boolean;
};

/** What `FlowWorker.serve` is set with: a one-line start's settings, and the entry's. */
export type ServeOptions =
  & Omit<FlowWorkerStartOptions, "sql" | "resource" | "invocationId" | "owner">
  & {
    /** The database (default: `connect(EDGE_WORKER_DB_URL)`, pgflow's variable; the serve
     * then ends the pool when it stops). */
    sql?: Sql;
    /** The function's resource (default: its name, the request's path, which is what
     * `ensure_workers` pings and `pgfence.register` must name). */
    resource?: string;
    /** Compile or verify the flow before the first term (default `{}`), or not (`false`). */
    compilation?: Compilation;
    /** The environment (default: Deno.env's variables): `SUPABASE_URL`,
     * `PGFLOW_AUTH_SECRET`, `SUPABASE_SERVICE_ROLE_KEY`, `SB_EXECUTION_ID`,
     * `EDGE_WORKER_DB_URL`, `HOST`, `PORT`. */
    env?: Record<string, string | undefined>;
    /** Where to listen (default: `HOST` and `PORT` from the environment, else Deno.serve's
     * 0.0.0.0:8000; the Edge Runtime chooses its own). */
    listen?: { hostname?: string; port?: number };
    /** The platform (default: `runtime()`). */
    platform?: Platform;
  };

/** A flow's compilation refused: the database's flow is missing (pgflow before 0.9) or
 * differs from the DSL's. `message` names what differs and the command that fixes it. */
export class FlowNotCompiled extends Error {
  /** What differs, one line each (pgflow's `differences`). */
  readonly differences: readonly string[];
  /** The refusal; `differences` as above. */
  constructor(message: string, differences: readonly string[] = []) {
    super(message);
    this.name = "FlowNotCompiled";
    this.differences = differences;
  }
}

/** The shape of a flow as pgflow 0.14's `ensure_flow_compiled` compares it. */
interface FlowShape {
  steps: {
    slug: string;
    stepType: string;
    dependencies: string[];
    whenUnmet: string;
    whenExhausted: string;
    requiredInputPattern: { defined: boolean; value?: unknown };
    forbiddenInputPattern: { defined: boolean; value?: unknown };
    options: Record<string, number>;
  }[];
  options: Record<string, number>;
}

/** A DSL step as the shape needs it. */
interface ShapeStepLike {
  slug: string;
  stepType?: string;
  dependencies: string[];
  options: Record<string, unknown>;
}

function numbers(options: Record<string, unknown>, keys: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const key of keys) if (typeof options[key] === "number") out[key] = options[key] as number;
  return out;
}

/** An input pattern of the shape: a step condition (`if`, `ifNot`), or none. */
function pattern(value: unknown): { defined: boolean; value?: unknown } {
  return value === undefined ? { defined: false } : { defined: true, value };
}

/**
 * The flow's shape, as pgflow 0.14's `ensure_flow_compiled` reads it (its `_get_flow_shape`
 * and `_compare_flow_shapes`), from the flow's public definition: each step in order, its type
 * and sorted dependencies, its conditions (`if`, `ifNot`, `whenUnmet`, `whenExhausted`, with
 * pgflow's defaults where the DSL has none, as before 0.14) and its options.
 */
function flowShape(flow: FlowDefinition): FlowShape {
  const lookup = flow as unknown as { getStepDefinition(slug: string): ShapeStepLike };
  return {
    steps: flow.stepOrder.map((slug) => {
      const step = lookup.getStepDefinition(slug);
      const options = step.options;
      return {
        slug,
        stepType: step.stepType ?? "single",
        dependencies: [...step.dependencies].sort(),
        whenUnmet: typeof options.whenUnmet === "string" ? options.whenUnmet : "skip",
        whenExhausted: typeof options.whenExhausted === "string" ? options.whenExhausted : "fail",
        requiredInputPattern: pattern(options.if),
        forbiddenInputPattern: pattern(options.ifNot),
        options: numbers(options, ["maxAttempts", "baseDelay", "timeout", "startDelay"]),
      };
    }),
    options: numbers(flow.options, ["maxAttempts", "baseDelay", "timeout"]),
  };
}

/**
 * Compiles or verifies `flow` in the database as pgflow's worker does at its start: pgflow
 * 0.14's `ensure_flow_compiled` (`compiled` when the flow was missing, `verified` when it
 * matches, `recompiled` with `allowDataLoss` or on a local Supabase); a mismatch is refused
 * (FlowNotCompiled). pgflow before 0.9 has no such function: there the flow is verified
 * against `pgflow.steps` and `pgflow.deps`, and a missing or different one is refused, naming
 * the command that compiles it.
 */
export async function ensureFlowCompiled(
  sql: Sql,
  flow: FlowDefinition,
  compilation: Compilation = {},
): Promise<"compiled" | "verified" | "recompiled" | "skipped"> {
  if (compilation === false) return "skipped";
  const shape = flowShape(flow);
  const [{ ensure }] = await sql`select to_regprocedure(
      'pgflow.ensure_flow_compiled(text, jsonb, boolean)') is not null as ensure`;
  if (ensure) {
    const [{ result }] = await sql`select pgflow.ensure_flow_compiled(${flow.slug},
        ${sql.json(shape as unknown as postgres.JSONValue)}, ${compilation.allowDataLoss ?? false})
        as result`;
    const { status, differences } = result as { status: string; differences: string[] };
    if (status === "mismatch") {
      throw new FlowNotCompiled(
        `flow ${flow.slug} in the database differs from the worker's: ${differences.join("; ")} ` +
          "(deploy a migration of the new flow with `pgflow compile`, or start with " +
          "compilation: { allowDataLoss: true } to recompile it, deleting its runs)",
        differences,
      );
    }
    return status as "compiled" | "verified" | "recompiled";
  }
  const rows = await sql`select s.step_slug, s.step_type,
                                coalesce(array_agg(d.dep_slug order by d.dep_slug)
                                           filter (where d.dep_slug is not null), '{}') as deps
                           from pgflow.steps s
                           left join pgflow.deps d
                             on d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
                          where s.flow_slug = ${flow.slug}
                          group by s.step_slug, s.step_type, s.step_index
                          order by s.step_index`;
  const ours = shape.steps.map((s) => `${s.slug} ${s.stepType} (${s.dependencies.join(", ")})`);
  const theirs = rows.map((r) =>
    `${r.step_slug} ${r.step_type} (${(r.deps as string[]).join(", ")})`
  );
  const differences = ours.length === 0 || rows.length === 0
    ? [`flow ${flow.slug} is not in the database`]
    : ours.flatMap((step, i) => step === theirs[i] ? [] : [`step ${i}: ${step} != ${theirs[i]}`])
      .concat(theirs.length > ours.length ? [`${theirs.length - ours.length} more steps`] : []);
  if (differences.length > 0) {
    throw new FlowNotCompiled(
      `${differences.join("; ")}: this pgflow compiles no flow at a worker's start; ` +
        "`npx pgflow compile <the flow's file>` writes its migration, then apply it " +
        "(`supabase migration up`)",
      differences,
    );
  }
  return "verified";
}

const answer = jsonResponse;

/** Supabase's local stack: its functions are reached through kong, and are not authenticated. */
function isLocal(env: Record<string, string | undefined>): boolean {
  try {
    return new URL(env.SUPABASE_URL ?? "").host === "kong:8000";
  } catch {
    return false;
  }
}

/** Equal strings, in time that depends on their length only. */
function sameSecret(a: string, b: string): boolean {
  const [x, y] = [new TextEncoder().encode(a), new TextEncoder().encode(b)];
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

/**
 * pgflow's authentication of the ping: none on a local Supabase; elsewhere
 * `Authorization: Bearer <PGFLOW_AUTH_SECRET, else SUPABASE_SERVICE_ROLE_KEY>`, the key
 * `ensure_workers` sends. Null when it passes, else the answer (401, or 500 when neither
 * secret is set).
 */
function refuseUnauthorized(
  request: Request,
  env: Record<string, string | undefined>,
): Response | null {
  if (isLocal(env)) return null;
  const key = env.PGFLOW_AUTH_SECRET || env.SUPABASE_SERVICE_ROLE_KEY;
  const header = request.headers.get("authorization");
  if (!header) return answer(401, { error: "Unauthorized", message: "Unauthorized" });
  if (!key) {
    return answer(500, {
      error: "Internal Server Error",
      message: "neither PGFLOW_AUTH_SECRET nor SUPABASE_SERVICE_ROLE_KEY is set",
    });
  }
  return sameSecret(header, `Bearer ${key}`)
    ? null
    : answer(401, { error: "Unauthorized", message: "Unauthorized" });
}

/** The entry `FlowWorker.serve` returns. */
export interface FlowEndpoint {
  /** The HTTP server. */
  readonly server: Deno.HttpServer;
  /** The worker of the current (or last) term, null before the first. */
  readonly worker: FlowWorker | null;
  /** Resolves when the entry has stopped (a shutdown signal, or `stop`): its last term
   * released, its worker marked stopped, the server closed. */
  readonly finished: Promise<void>;
  /** Stops: the term in hand ends (see `WorkerLoop.stop`), then the server. */
  stop(reason?: string): void;
}

/** The message of an error, ids redacted, without its stack. */
function said(e: unknown): string {
  const text = e instanceof Error ? e.message : String(e);
  return text.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, "…");
}

/** Starts the term of one invocation; the answer to its ping. */
async function term(
  flow: FlowDefinition,
  options: ServeOptions,
  sql: Sql,
  functionName: string,
  invocationId: string,
  once: { prepared: boolean },
): Promise<{ response: Response; worker?: FlowWorker; work?: Promise<void> }> {
  const env = options.env ?? readEnv();
  const owner = new Owner({
    sql,
    resource: options.resource ?? functionName,
    owner: `edge-${env.SB_EXECUTION_ID ?? crypto.randomUUID()}`,
    ttl: options.ttl,
    renewEvery: options.renewEvery,
    clock: options.clock,
    retry: options.retry,
  });
  try {
    if (!(await owner.acquire(invocationId))) {
      return {
        response: answer(409, {
          started: false,
          message: "not the pending invocation: replayed, or another worker is current",
        }),
      };
    }
  } catch (e) {
    if (e instanceof ResourceDisabled) {
      return { response: answer(503, { started: false, paused: true, message: said(e) }) };
    }
    if (e instanceof InvalidArgument) { // an invocation id the database never issued
      return { response: answer(409, { started: false, message: said(e) }) };
    }
    return { response: answer(500, { error: "Internal Server Error", message: said(e) }) };
  }
  try {
    if (!once.prepared) {
      // pgflow 0.14's worker start: the function tracked for ensure_workers, the flow compiled
      // or verified; once per isolate.
      const [{ tracked }] = await sql`select to_regprocedure(
          'pgflow.track_worker_function(text)') is not null as tracked`;
      if (tracked) await sql`select pgflow.track_worker_function(${functionName})`;
      await ensureFlowCompiled(sql, flow, options.compilation);
      once.prepared = true;
    }
  } catch (e) {
    await owner.release().catch(() => {});
    return { response: answer(500, { error: "Internal Server Error", message: said(e) }) };
  }
  const worker = new FlowWorker({ ...options, owner, flow, input: options.input ?? "pgflow" });
  const work = worker.run().catch(() => {
    // A fault ended the term: its lease is released or runs out, and ensure_workers starts
    // another invocation.
  }).finally(async () => {
    // pgflow's worker marks itself stopped as it ends, so ensure_workers pings at once.
    if (owner.leaseId !== null) {
      await sql`select pgfence_pgflow.mark_worker_stopped(${owner.leaseId}::uuid)`.catch(() => {});
    }
  });
  return {
    response: answer(202, {
      status: "started",
      started: true,
      generation: String(owner.generation),
      functionName,
    }),
    worker,
    work,
  };
}

function serveFlow(flow: FlowDefinition, options: ServeOptions): FlowEndpoint {
  const env = options.env ?? readEnv();
  const own = options.sql === undefined;
  const sql = options.sql ?? connect(env.EDGE_WORKER_DB_URL ?? "");
  const platform = options.platform ?? runtime();
  const once = { prepared: false };
  let current: { worker: FlowWorker; work: Promise<void> } | null = null;
  let stopping: string | null = null;
  let running = false;
  let last: Promise<unknown> = Promise.resolve();
  let finish = () => {};
  const finished = new Promise<void>((resolve) => (finish = resolve));

  const handler = async (request: Request): Promise<Response> => {
    const refused = refuseUnauthorized(request, env);
    if (refused !== null) return refused;
    const invocation = await invocationOf(request);
    if (invocation instanceof Response) return invocation;
    if (stopping !== null || running) {
      return answer(409, { started: false, message: "a worker is running in this isolate" });
    }
    const functionName = new URL(request.url).pathname.replace(/^\/+|\/+$/g, "");
    running = true; // one term at a time: a ping meanwhile is refused above
    const begun = term(flow, options, sql, functionName, invocation, once);
    last = begun.then((started) => started.work);
    const started = await begun;
    if (started.worker !== undefined && started.work !== undefined) {
      current = { worker: started.worker, work: started.work };
      started.work.finally(() => (running = false));
      platform.keepAlive(started.work);
      if (stopping !== null) {
        started.worker.stop({ grace: started.worker.shutdownGrace, reason: stopping });
      }
    } else {
      running = false;
    }
    return started.response;
  };
  const port = env.PORT === undefined ? undefined : Number(env.PORT);
  const server = Deno.serve(options.listen ?? { hostname: env.HOST, port }, handler);

  const stop = (reason = "stop") => {
    if (stopping !== null) return;
    stopping = reason;
    current?.worker.stop({ grace: current.worker.shutdownGrace, reason });
    (async () => {
      await last; // the term in hand, or the one a ping is starting (stopped as it starts)
      await server.shutdown();
      if (own) await sql.end();
    })().finally(finish);
  };
  const remove = platform.onShutdown(stop);
  finished.finally(remove);
  return {
    server,
    get worker() {
      return current?.worker ?? null;
    },
    finished,
    stop,
  };
}

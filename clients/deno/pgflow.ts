/**
 * A pgflow worker on pgfence: pgflow's worker protocol (read the flow's queue, start its tasks,
 * complete or fail them) through pgfence's pgflow layer (`pgfence_pgflow`), under an Owner's
 * lease on the worker function's resource. See docs/pgflow.md.
 *
 * The database does the fencing: `pgfence_pgflow.start_tasks` reads and starts only under the
 * current lease, in one statement, and `complete_task` / `fail_task` answer `accepted`,
 * `duplicate` or `stale` by the attempt that holds the task (I5). This class only stops
 * starting as soon as ownership is in doubt, and always drains and releases.
 *
 * @module
 */
import type postgres from "postgres";
import { LeaseLost, LeaseNotCurrent, type Owner, pgfenceError, type Verdict } from "./mod.ts";

/** One started step task: the attempt id is what its result is reported with. */
export interface StepTask {
  attemptId: string;
  runId: string;
  stepSlug: string;
  taskIndex: number;
  /** pgflow's input: `{ run: <the run's input>, <dependency>: <its output>, ... }`. */
  input: unknown;
  msgId: bigint;
}

export interface StepContext {
  task: StepTask;
  /** Aborts when the owner gives the lease up (a handler past its deadline, a refusal). */
  signal: AbortSignal;
}

/** Returns the step's output (JSON); throws to fail the task (pgflow retries it or fails it). */
export type StepHandler = (input: unknown, context: StepContext) => unknown;

export interface FlowWorkerOptions {
  owner: Owner;
  /** The flow; pgflow queues its tasks on the queue of the same name. */
  flowSlug: string;
  /** One handler per step slug. */
  handlers: Record<string, StepHandler>;
  /** Messages per start (default 1). */
  qty?: number;
  /** Seconds a read message stays hidden before pgflow's start sets its own (default 2). */
  visibility?: number;
  /** Seconds to wait when the queue is empty (default 1). */
  idleWait?: number;
  /** Seconds per handler call on the owner's clock (default: pgflow's step timeout, 60). */
  handlerTimeout?: number;
}

/**
 * Starts and handles the tasks of one pgflow flow while its Owner is valid; drains and
 * releases the lease when `run` ends, however it ends. `verdicts` counts the database's
 * answers to the results it reported.
 */
export class FlowWorker {
  readonly owner: Owner;
  readonly flowSlug: string;
  readonly handlers: Record<string, StepHandler>;
  readonly qty: number;
  readonly visibility: number;
  readonly idleWait: number;
  readonly handlerTimeout: number;
  handled = 0;
  readonly verdicts: Record<Verdict, number> = { accepted: 0, duplicate: 0, stale: 0 };
  #stop = false;
  #wake: (() => void) | null = null;

  constructor(options: FlowWorkerOptions) {
    this.owner = options.owner;
    this.flowSlug = options.flowSlug;
    this.handlers = options.handlers;
    this.qty = options.qty ?? 1;
    this.visibility = options.visibility ?? 2;
    this.idleWait = options.idleWait ?? 1;
    this.handlerTimeout = options.handlerTimeout ?? 60;
  }

  /** Drains: start nothing more, finish the handler in hand, release. */
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
   * The loop. It ends after `maxTasks` handler calls, on `stop`, when ownership is in doubt,
   * or (`untilIdle`) when the flow's queue has nothing to start: the shape of an Edge Function
   * invocation that must not idle.
   */
  async run(options: { maxTasks?: number; untilIdle?: boolean } = {}): Promise<void> {
    const { maxTasks, untilIdle = false } = options;
    try {
      while (!this.#stop && (maxTasks === undefined || this.handled < maxTasks)) {
        if (!this.owner.valid) break; // ownership in doubt: start nothing more
        const tasks = await this.start();
        if (tasks.length === 0) {
          if (untilIdle) break;
          await this.#idle();
          continue;
        }
        for (const task of tasks) {
          if (!this.owner.valid) break; // the rest come back when their visibility runs out
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

  /** One fenced read and start, in one statement: nothing starts unless the lease is current. */
  protected async start(): Promise<StepTask[]> {
    const sql = this.owner.sql;
    let rows: postgres.Row[];
    try {
      rows = await sql`select attempt_id, run_id, step_slug, task_index, input, msg_id
                         from pgfence_pgflow.start_tasks(${this.owner.leaseId}::uuid,
                                ${this.flowSlug}, ${this.flowSlug},
                                make_interval(secs => ${this.visibility}), ${this.qty})`;
    } catch (e) {
      const error = pgfenceError(e);
      if (error instanceof LeaseNotCurrent) {
        this.owner.markLost(`start refused: ${error.message}`);
        return [];
      }
      throw error;
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

  protected async handle(task: StepTask): Promise<void> {
    const owner = this.owner;
    // A hung handler must not keep the lease alive by proxy: past its deadline the owner stops
    // renewing and drains, and its late result is judged like any other (I5).
    owner.renewUntil(
      owner.clock() + this.handlerTimeout,
      `a step handler ran past its deadline (${this.handlerTimeout} s)`,
    );
    let kind: "complete" | "fail" = "complete";
    let body: unknown;
    try {
      const handler = this.handlers[task.stepSlug];
      if (handler === undefined) throw new Error(`no handler for step ${task.stepSlug}`);
      body = await handler(task.input, { task, signal: owner.signal });
    } catch (e) {
      if (e instanceof LeaseLost) throw e;
      kind = "fail";
      body = e instanceof Error ? e.message : String(e);
    } finally {
      owner.renewUntil(null);
    }
    await this.report(kind, task.attemptId, body);
    this.handled += 1;
  }

  /** complete_task or fail_task; the database's verdict is counted in `verdicts`. */
  protected async report(
    kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict> {
    const sql = this.owner.sql;
    const json = body === undefined || body === null ? null : sql.json(body as postgres.JSONValue);
    let row: postgres.Row;
    try {
      [row] = kind === "complete"
        ? await sql`select pgfence_pgflow.complete_task(${attemptId}::uuid, ${json}) as verdict`
        : await sql`select pgfence_pgflow.fail_task(${attemptId}::uuid, ${
          String(body)
        }) as verdict`;
    } catch (e) {
      throw pgfenceError(e);
    }
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

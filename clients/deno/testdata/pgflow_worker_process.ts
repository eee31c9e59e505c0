/**
 * A pgflow worker as a process of its own, for tests/test_deno_pgflow.py (pause, kill, update
 * window): it works flow `two` for $RESOURCE at $DATABASE_URL; each step handler prints
 * `{"started": attemptId, "step": slug}` and waits for a line on stdin before it returns
 * `{"by": $NAME}`. At the end it prints what it saw.
 *
 * With START=1 it is `FlowWorker.start` of the same flow, defined with the DSL, stopped by a
 * signal. With UNFENCED=1 it is the negative control: the same worker speaking pgflow's own protocol
 * (pgmq.read_with_poll, pgflow.start_tasks, pgflow.complete_task), which no lease fences.
 */
import type postgres from "postgres";
import { Flow } from "@pgflow/dsl";
import { connect, Owner } from "pgfence";
import { FlowWorker, type StepContext, type StepTask } from "pgfence/pgflow";
import type { Verdict } from "pgfence";

class UnfencedFlowWorker extends FlowWorker {
  readonly workerId = crypto.randomUUID();

  protected override async claim(): Promise<StepTask[]> {
    const sql = this.owner.sql;
    await sql`insert into pgflow.workers (worker_id, queue_name, function_name)
              values (${this.workerId}::uuid, ${this.flowSlug}, ${this.owner.resource})
              on conflict do nothing`;
    const read = await sql`select msg_id from pgmq.read_with_poll(${this.flowSlug}, 30, 1, 1, 100)`;
    if (read.length === 0) return [];
    const rows = await sql`select run_id, step_slug, task_index, input, msg_id
                             from pgflow.start_tasks(${this.flowSlug},
                                    ${read.map((r) => r.msg_id as string)}::bigint[],
                                    ${this.workerId}::uuid)`;
    return rows.map((r) => ({
      attemptId: JSON.stringify([r.run_id, r.step_slug, r.task_index]),
      runId: r.run_id as string,
      stepSlug: r.step_slug as string,
      taskIndex: r.task_index as number,
      input: r.input,
      msgId: BigInt(r.msg_id as string),
      visibleUntil: Infinity, // pgflow's own protocol checks nothing
    }));
  }

  protected override async report(
    _kind: "complete" | "fail",
    attemptId: string,
    body: unknown,
  ): Promise<Verdict> {
    const sql = this.owner.sql;
    const [runId, stepSlug, taskIndex] = JSON.parse(attemptId) as [string, string, number];
    await sql`select pgflow.complete_task(${runId}::uuid, ${stepSlug}, ${taskIndex},
                                          ${sql.json(body as postgres.JSONValue)})`;
    this.verdicts.accepted += 1; // pgflow gives no verdict: whatever it did, it did
    return "accepted";
  }
}

const sql = connect(Deno.env.get("DATABASE_URL")!);
const name = Deno.env.get("NAME")!;
const owner = new Owner({
  sql,
  resource: Deno.env.get("RESOURCE")!,
  owner: name,
  renewEvery: 0.05,
});
const stdin = Deno.stdin.readable.getReader();
const step = async (_input: unknown, { task }: { task: StepTask }) => {
  console.log(JSON.stringify({ started: task.attemptId, step: task.stepSlug }));
  await stdin.read();
  return { by: name };
};
const options = {
  owner,
  flowSlug: "two",
  handlers: { first: step, second: step },
  // Runs out only when the test moves time, however long it holds the process paused (pgflow's
  // 60 s did not cover a successor's Deno start on a loaded machine; then the resumed worker
  // gave its lease up for its deadline before its renewal could be refused).
  handlerTimeout: 600,
};
if (Deno.env.get("START") === "1") {
  // The one-line start, with flow `two` defined by the DSL: stopped by SIGTERM or SIGINT
  // (the process platform), it finishes the task in hand, releases and ends.
  const dsl = (input: unknown, context: unknown) => step(input, context as StepContext);
  const two = new Flow({ slug: "two", timeout: 600 })
    .step({ slug: "first" }, dsl)
    .step({ slug: "second", dependsOn: ["first"] }, dsl);
  const worker = FlowWorker.start(two, {
    sql,
    resource: Deno.env.get("RESOURCE")!,
    owner: name,
    renewEvery: 0.05,
    idleWait: 0.05,
    shutdownGrace: Infinity, // the task in hand finishes, however long the test takes
  });
  // Says when a signal has stopped it, so that the test lets the handler return only then.
  worker.stopping?.addEventListener(
    "abort",
    () => console.log(JSON.stringify({ stopped: worker.stoppedBy })),
  );
  try {
    await worker.done;
  } finally {
    console.log(JSON.stringify({
      verdicts: worker.verdicts,
      handled: worker.handled,
      stoppedBy: worker.stoppedBy,
    }));
    await sql.end();
  }
  Deno.exit(0);
}
const worker = Deno.env.get("UNFENCED") === "1"
  ? new UnfencedFlowWorker(options)
  : new FlowWorker(options);
try {
  if (!(await owner.acquire())) throw new Error("not acquired");
  console.log(JSON.stringify({ acquired: owner.leaseId }));
  await worker.run({ untilIdle: true });
} finally {
  console.log(
    JSON.stringify({ verdicts: worker.verdicts, handled: worker.handled, lost: owner.lost }),
  );
  await sql.end();
}

/**
 * The fault campaign's pgflow worker function (tests/campaign; docs/campaign.md, "The layers"):
 * an Edge Function as pgflow's docs write one, one call of `FlowWorker.serve(flow)`, in the
 * stand-in of Supabase's Edge Runtime (edge_runtime.ts, imported first). Flow $FLOW: `first`
 * -> `second`, each step's timeout $FLOW_TIMEOUT seconds. Each handler writes one row to the
 * resource's protected table, campaign.writes_$RESOURCE, in a transaction that fenced the lease
 * its task was started under (`context.owner.fenced`), stamped with lease, generation and
 * attempt id, after $WORK seconds of "work" inside that transaction, and returns
 * `{ "write": <its id> }`, which pgflow keeps as the step's output.
 *
 * The campaign steers it through stdin as it steers its Python workers (tests/campaign/worker.py):
 * `pause before-complete` arms the point between the fenced write and the result: the handler
 * answers `paused before-complete` on stdout and stops the process (SIGSTOP; SIGCONT resumes
 * it); `disarm` cancels a pause not taken yet, answering `disarmed`. stdin closed: the
 * supervisor is gone, and so is this process.
 */
import "./edge_runtime.ts";
import { Flow } from "@pgflow/dsl";
import { LeaseLost } from "pgfence";
import { FlowWorker, type StepContext } from "pgfence/pgflow";

const env = Deno.env.toObject();
const name = `edge-${env.SB_EXECUTION_ID}`;
const table = `campaign.writes_${env.RESOURCE}`;
const work = Number(env.WORK) * 1000;

let armed: string | null = null;

async function control(): Promise<void> {
  const decoder = new TextDecoder();
  let buffered = "";
  for await (const chunk of Deno.stdin.readable) {
    buffered += decoder.decode(chunk, { stream: true });
    for (let end = buffered.indexOf("\n"); end >= 0; end = buffered.indexOf("\n")) {
      const [command, point] = buffered.slice(0, end).trim().split(" ");
      buffered = buffered.slice(end + 1);
      if (command === "pause") armed = point;
      else if (command === "disarm" && armed !== null) {
        armed = null;
        console.log("disarmed");
      }
    }
  }
  Deno.exit(0);
}
control();

function pauseAt(point: string): void {
  if (armed !== point) return;
  armed = null;
  console.log(`paused ${point}`);
  Deno.kill(Deno.pid, "SIGSTOP"); // the whole isolate, its renewals too
}

async function step(_input: unknown, context: StepContext): Promise<{ write: number }> {
  const { owner, task } = context;
  let write: number;
  try {
    write = await owner.fenced(async (tx, generation) => {
      await new Promise((resolve) => setTimeout(resolve, work));
      // BEGIN went right before fence: now() is no later than the fence.
      const [row] = await tx`
        insert into ${tx(table)} (lease_id, generation, attempt_id, worker, fenced_not_before)
        values (${owner.leaseId}::uuid, ${String(generation)}::bigint, ${task.attemptId}::uuid,
                ${name}, now())
        returning id`;
      return Number(row.id);
    });
  } catch (e) {
    // Any error of the write (a refused fence, a lost connection) ends the term, as the
    // campaign's Python workers do: not a fail_task, which would cost the task an attempt for
    // what is not its fault. The task is taken over once its visibility runs out.
    if (e instanceof LeaseLost) throw e;
    throw new LeaseLost(`the handler's write failed: ${e instanceof Error ? e.name : e}`);
  }
  pauseAt("before-complete");
  return { write };
}

const handler = (input: unknown, context: unknown) => step(input, context as StepContext);
const flow = new Flow({
  slug: env.FLOW,
  timeout: Number(env.FLOW_TIMEOUT),
  maxAttempts: Number(env.MAX_ATTEMPTS),
  baseDelay: 1,
})
  .step({ slug: "first" }, handler)
  .step({ slug: "second", dependsOn: ["first"] }, handler);

const ttl = Number(env.TTL);
FlowWorker.serve(flow, { ttl, renewEvery: ttl / 3, idleWait: Number(env.IDLE_WAIT) });

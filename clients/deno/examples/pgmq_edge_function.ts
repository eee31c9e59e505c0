/**
 * A pgmq consumer shaped like a Supabase Edge Function (Supabase Queues are pgmq): a supervisor
 * (pg_cron, or any scheduler) asks `pgfence.request_start(resource)` for an invocation id and,
 * when it gets one, calls this function with it; the function acquires the lease with that
 * invocation (the startup handshake), answers at once, and reads the queue through the pgmq
 * layer until it is idle, then drains and releases. A stale invocation reads nothing: the
 * database refuses its reads, and a late archive of a message read again since is `stale`.
 *
 *   POST /  {"invocation_id": "<uuid from pgfence.request_start>"}
 *   202 {"started": true, "generation": "7"}  |  409 {"started": false}  |  503 (paused)
 *
 * Environment: DATABASE_URL (the transaction pooler, port 6543 on Supabase), PGFENCE_RESOURCE
 * (default `jobs-worker`), QUEUE (default `jobs`), HOST and PORT (default 0.0.0.0:8000).
 */
import { connect, Owner, PgmqWorker, ResourceDisabled } from "pgfence";

const sql = connect(Deno.env.get("DATABASE_URL")!);
const resource = Deno.env.get("PGFENCE_RESOURCE") ?? "jobs-worker";
const queue = Deno.env.get("QUEUE") ?? "jobs";

function answer(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

const listen = {
  hostname: Deno.env.get("HOST") ?? "0.0.0.0",
  port: Number(Deno.env.get("PORT") ?? 8000),
};
Deno.serve(listen, async (request) => {
  const { invocation_id: invocationId } = await request.json() as { invocation_id?: string };
  const owner = new Owner({ sql, resource, owner: `edge-${crypto.randomUUID()}` });
  try {
    if (!(await owner.acquire(invocationId ?? null))) return answer(409, { started: false });
  } catch (e) {
    if (e instanceof ResourceDisabled) return answer(503, { started: false, paused: true });
    throw e;
  }
  const worker = new PgmqWorker({
    owner,
    queue,
    // Key external effects by task.taskId (the message's msg_id, the same for every read).
    handler: (message, { task }) => console.log("message", task.taskId, message),
  });
  // beforeunload (wall clock, CPU, memory): hand back what is in hand, release.
  const removeShutdown = worker.installShutdown();
  // run() passes its own promise to EdgeRuntime.waitUntil: the isolate lives until release.
  worker.run({ untilIdle: true }).catch((e) => console.error("worker:", e)).finally(
    removeShutdown,
  );
  return answer(202, { started: true, generation: String(owner.generation) });
});
